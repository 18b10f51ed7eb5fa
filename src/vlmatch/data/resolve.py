"""Data arguments (``--data``, ``data.path``, ``resolve_data``): ``toyworld`` or nothing, the bundled synthetic data
generated on first use into ``$VLMATCH_CACHE/toyworld`` (read at call time; default ``~/.cache/vlmatch``), or a
precomp folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import DataError

TOYWORLD = "toyworld"


def cache_dir() -> Path:
    """``$VLMATCH_CACHE``, or ``~/.cache/vlmatch``."""
    return Path(os.environ.get("VLMATCH_CACHE") or Path.home() / ".cache" / "vlmatch").expanduser()


def expand_path(value: str) -> str:
    """A portable path as this machine's: ``$VLMATCH_CACHE`` is :func:`cache_dir` (set or not), ``$VAR`` and ``~``
    as the shell expands them."""
    text = CACHE_VARIABLE.sub(lambda _: str(cache_dir()).replace("\\", "/"), str(value))
    return os.path.expanduser(os.path.expandvars(text))


CACHE_VARIABLE = re.compile(r"\$(?:\{VLMATCH_CACHE\}|VLMATCH_CACHE(?![A-Za-z0-9_]))")
UNSET_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")  # what expandvars leaves: a variable not set


def toyworld_dir() -> Path:
    return cache_dir() / TOYWORLD


def resolve_data(path=None) -> Path:
    """The folder a data argument names: ``toyworld``/None -> the generated toy world, else the path."""
    if path is None or str(path) == TOYWORLD:
        from .synth import ensure_toyworld

        return ensure_toyworld(toyworld_dir())
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(p, f"data folder not found{source_hint(p)} (a data argument is a precomp folder, "
                           f"or `{TOYWORLD}` for the bundled synthetic data)")
    return p


def source_hint(p) -> str:
    """'; where it comes from' for a missing path of well-known data (Flickr8k), else ''."""
    return "; " + FLICKR8K_SOURCE if "flickr8k" in str(p).lower() else ""


FLICKR8K_SOURCE = ("Flickr8k is not shipped with vlmatch: request the images from the dataset's authors "
                   "(Hodosh, Young, Hockenmaier 2013), take Karpathy's dataset_flickr8k.json split file, put both "
                   "in one folder (images/ + dataset_flickr8k.json), then run `vlmatch features extract`")
