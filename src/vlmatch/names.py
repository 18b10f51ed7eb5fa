"""Names that become one folder or file name (a run's, a shipped model's): such a path is replaced whole, so a name
that is not exactly one ordinary path component (``.``, ``..``, ``a/b``) would write or remove somewhere else."""

from __future__ import annotations

import unicodedata

# a file name's limit is 255 bytes, less room for what vlmatch adds (".NAME.<12 hex>.tmp", "NAME.prev", ...)
MAX_BYTES = 200


def name_problem(name) -> str | None:
    """What keeps ``name`` from being one plain path component, in words a one-line error can quote (None: nothing)."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__} {name!r}"
    if not name:
        return "is empty"
    if name in (".", ".."):
        return f"{name!r} is a folder's own name, not a new one (it would stand for the folder itself or its parent)"
    for ch in name:
        if ch in "/\\":
            return f"{name!r} holds {ch!r}: a name is one folder name, without separators"
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or ch == "\x00":
            return f"{name!r} holds the control or invisible character U+{ord(ch):04X}"
    if name.startswith("."):
        return f"{name!r} starts with '.': a hidden name (vlmatch keeps its temporaries under such names)"
    if name != name.strip():
        return f"{name!r} starts or ends with a space"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        return f"is {size} bytes long ({name[:24]!r}...); at most {MAX_BYTES} (a file name's limit, less room " \
               "for vlmatch's temporaries)"
    return None
