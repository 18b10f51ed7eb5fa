"""Names that become one folder or file name: a run's, a shipped model's.

A name given in a recipe or on a command line is joined to a folder (``runs/<name>``,
``pretrained/weights/<name>``, ``results/<name>.json``) and that path is then replaced whole: a name
that is not exactly one ordinary path component would write, or remove, somewhere else (``.`` is the
folder itself, ``..`` its parent, ``a/b`` a folder below). :func:`name_problem` says what is wrong with
one, in words a one-line error can quote.
"""

from __future__ import annotations

import unicodedata

# a file name's limit is 255 bytes on the usual file systems; vlmatch adds to a name for its temporaries and
# records (".NAME.<12 hex>.tmp", "NAME.prev", "NAME.json", ".NAME.staging"), so a name keeps room for them
MAX_BYTES = 200


def name_problem(name) -> str | None:
    """What keeps ``name`` from being one plain path component (None when nothing does): not a string,
    empty, ``.`` or ``..``, a separator (``/``, ``\\``), a control or invisible character (NUL, a line
    break, a zero-width space), a leading dot (a hidden name, as vlmatch's temporaries are), spaces at
    either end, or longer than :data:`MAX_BYTES` bytes in UTF-8."""
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
