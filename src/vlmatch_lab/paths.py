"""Where the rooms' data and their one cache are, read at call time: ``cache_root()`` (``$VLMATCH_CACHE``, the
library's own cache root, default ``~/.cache/vlmatch``: feature caches, ``runs/``, scratch folders) and
``data_root()`` (``$VLMATCH_DATA``, holding ``flickr8k/`` and ``flickr30k_entities/``; default ``shared`` beside the
checkout). Recipes write them as ``$VLMATCH_CACHE/...`` and ``$VLMATCH_DATA/...`` (:func:`expand`, :func:`portable`).
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
    """``$VLMATCH_DATA``, default ``shared`` beside the checkout; ``check``: a missing folder ends the script in one line."""
    named = os.environ.get(DATA_VAR)
    root = Path(named).expanduser() if named else CHECKOUT.parent / "shared"
    if check and not root.is_dir():
        where = f"{DATA_VAR}={named}" if named else f"{root} (unset {DATA_VAR}'s default: 'shared' beside the checkout)"
        raise SystemExit(f"no data folder: {where} is not a folder; set {DATA_VAR} to the folder that holds flickr8k/ "
                         "and flickr30k_entities/")
    return root


ROOTS = {CACHE_VAR: cache_root, DATA_VAR: lambda: data_root(check=False)}


def expand(path: str) -> str:
    """``$VLMATCH_CACHE/x`` -> ``<cache_root()>/x``, ``$VLMATCH_DATA/x`` -> ``<data_root()>/x`` (also ``${NAME}``)."""
    for var, root in ROOTS.items():
        for form in (f"${{{var}}}", f"${var}"):
            if path == form or path.startswith(form + "/"):
                return str(root()) + path[len(form):]
    return path


def portable(path: str | None) -> str | None:
    """The reverse of :func:`expand`: a path under a root (or a legacy ``benchmarks/cache/``) as ``$NAME/...``."""
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
