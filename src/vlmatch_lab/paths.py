"""Where the rooms' data and their one cache are: the only place either location is written.

* ``cache_root()``: ``$VLMATCH_CACHE``, the same root the vlmatch library keeps its own caches in (the toy world,
  the text encoders' outputs), default ``~/.cache/vlmatch``. The rooms' feature caches (``flickr8k-<backbone>...``),
  run folders (``runs/``) and every benchmark's scratch folders live under it.
* ``data_root()``: ``$VLMATCH_DATA``, the folder holding ``flickr8k/`` (images/ + dataset_flickr8k.json) and
  ``flickr30k_entities/``; default the ``shared`` folder beside the checkout. No command makes it.

Both are read at call time. A recipe writes these locations as ``$VLMATCH_CACHE/...`` and ``$VLMATCH_DATA/...``
(:func:`expand`, :func:`portable`), so a recipe recorded on one machine runs on another.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VAR = "VLMATCH_CACHE"
DATA_VAR = "VLMATCH_DATA"
# src/vlmatch_lab/paths.py -> the checkout, whose neighbour `shared` holds the data by default
CHECKOUT = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """``$VLMATCH_CACHE``, default ``~/.cache/vlmatch``: one root for the library's caches and the rooms'."""
    from vlmatch.data.resolve import cache_dir

    return cache_dir()


def data_root(check: bool = True) -> Path:
    """``$VLMATCH_DATA``, default the ``shared`` folder beside the checkout. ``check``: a missing folder ends the
    script with one line naming the variable (``check=False``: the path only, e.g. for a default shown in help)."""
    named = os.environ.get(DATA_VAR)
    root = Path(named).expanduser() if named else CHECKOUT.parent / "shared"
    if check and not root.is_dir():
        where = f"{DATA_VAR}={named}" if named else f"{root} (unset {DATA_VAR}'s default: 'shared' beside the checkout)"
        raise SystemExit(f"no data folder: {where} is not a folder; set {DATA_VAR} to the folder that holds flickr8k/ "
                         "and flickr30k_entities/")
    return root


ROOTS = {CACHE_VAR: cache_root, DATA_VAR: lambda: data_root(check=False)}


def expand(path: str) -> str:
    """``$VLMATCH_CACHE/x`` -> ``<cache_root()>/x`` and ``$VLMATCH_DATA/x`` -> ``<data_root()>/x`` (also written
    ``${NAME}``, and the bare names); any other path as it is. A recipe's paths go through here before training."""
    for var, root in ROOTS.items():
        for form in (f"${{{var}}}", f"${var}"):
            if path == form or path.startswith(form + "/"):
                return str(root()) + path[len(form):]
    return path


def portable(path: str | None) -> str | None:
    """The reverse of :func:`expand` for a path recorded on some machine: a path under this machine's cache root,
    or under a ``benchmarks/cache/`` folder (where the rooms kept their cache before it had a root of its own),
    becomes ``$VLMATCH_CACHE/...``; one under the data root, ``$VLMATCH_DATA/...``; any other path as it is."""
    if not path:
        return path
    for var, root in ROOTS.items():
        p = Path(path)
        if p.is_absolute() and p.is_relative_to(root()):
            rest = p.relative_to(root()).as_posix()
            return f"${var}" + (f"/{rest}" if rest != "." else "")
    marker = "benchmarks/cache/"
    if path.startswith(marker) or f"/{marker}" in path:
        return f"${CACHE_VAR}/" + path.split(marker, 1)[1]
    return path
