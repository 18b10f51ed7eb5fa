"""Checks of what an index folder holds and of what goes into one (``manifest.json``, ``items.json``, a caption
file, ``--nlist``), so that a damaged, hand-edited or unsuitable input fails with one line naming the file and the
problem, never a KeyError or a library's message.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, DataError
from ..io import read_json

# Every caption row of the store is padded to the longest caption: one 20,000-word line would make
# each of them 20,000 tokens wide. Captions of the usual data sets have at most about 80 tokens.
MAX_CAPTION_TOKENS = 128
STAGE1_KINDS = ("flat", "ivf", "hnsw")
COLLECTIONS = {"images": "path", "captions": "text"}  # collection -> the field its items carry
REBUILD = "; build the index again"


def _what(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


def check_manifest(path, manifest) -> dict:
    """``manifest`` (read from ``path``) if it has the shape opening and updating an index rely on."""
    path = Path(path)
    if not isinstance(manifest, dict):
        raise DataError(path, f"an index manifest is a JSON object, this one is {_what(manifest)}{REBUILD}")
    model = manifest.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise DataError(path, f"'model' must be an object with the model's 'name'{REBUILD}")
    colls = manifest.get("collections")
    if not isinstance(colls, dict):
        raise DataError(path, f"'collections' must be an object (images, captions), found {_what(colls)}{REBUILD}")
    for name, coll in colls.items():
        if name not in COLLECTIONS:
            raise DataError(path, f"unknown collection {name!r} (an index holds {' and '.join(COLLECTIONS)}){REBUILD}")
        info = coll.get("stage1") if isinstance(coll, dict) else None
        if not isinstance(info, dict):
            raise DataError(path, f"collection {name!r} lacks its 'stage1' description{REBUILD}")
        if info.get("kind") not in STAGE1_KINDS:
            raise DataError(path, f"collection {name!r}: stage-1 kind {info.get('kind')!r} is not one of "
                                  f"{', '.join(STAGE1_KINDS)}{REBUILD}")
    for key in ("dims", "backbone", "source"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise DataError(path, f"'{key}' must be an object, found {_what(manifest[key])}{REBUILD}")
    regions = (manifest.get("dims") or {}).get("regions")
    if regions is not None and (isinstance(regions, bool) or not isinstance(regions, int) or regions < 1):
        raise DataError(path, f"dims.regions must be a positive integer, found {regions!r}{REBUILD}")
    return manifest


def read_items(path, field: str) -> list[dict]:
    """The table ``items.json``: objects with a unique integer ``id`` and a string ``field``."""
    path = Path(path)
    items = read_json(path, "missing (incomplete index?)")
    if not isinstance(items, list):
        raise DataError(path, f"the item table is a JSON list, this one is {_what(items)}{REBUILD}")
    seen = set()
    for row, it in enumerate(items):
        if not isinstance(it, dict):
            raise DataError(path, f"row {row} is {_what(it)}, not an object{REBUILD}")
        i = it.get("id")
        if isinstance(i, bool) or not isinstance(i, int):
            raise DataError(path, f"row {row} has no integer 'id' (found {i!r}){REBUILD}")
        if i in seen:
            raise DataError(path, f"id {i} appears twice (row {row}){REBUILD}")
        seen.add(i)
        if not isinstance(it.get(field), str):
            raise DataError(path, f"row {row} (id {i}) has no '{field}' string{REBUILD}")
    return items


def check_nlist(nlist: int | None, n: int, what: str) -> None:
    """IVF needs 1 <= nlist <= n (faiss trains one centroid per list on the collection itself)."""
    if nlist is None:
        return
    if isinstance(nlist, bool) or not isinstance(nlist, int) or nlist < 1:
        raise ConfigError(f"--nlist must be an integer >= 1, not {nlist!r}")
    if nlist > n:
        raise ConfigError(f"--nlist {nlist} asks for more IVF lists than the {n} {what} to index (each list needs "
                          f"items; faiss wants about 39 per list): give at most {n}, or leave --nlist out")


def read_captions(model, path, ann: str = "auto", nlist: int | None = None, chunk: int = 512) -> tuple[list[str], int]:
    """A caption file's lines and the width (tokens of the longest) of their store rows; refuses a
    caption over :data:`MAX_CAPTION_TOKENS` tokens, naming its line. Tokenised ``chunk`` lines at a
    time, so one long line costs one chunk's padding, not the whole file's."""
    from ..data.precomp import read_caption_lines

    caps = read_caption_lines(path)
    if ann == "ivf":
        check_nlist(nlist, len(caps), "captions")
    width = 0
    for a in range(0, len(caps), chunk):
        part = caps[a:a + chunk]
        # a line that could be far over the cap is tokenised alone: its padding is not paid chunk-wide
        together = [j for j, c in enumerate(part) if len(c) <= 8 * MAX_CAPTION_TOKENS]
        lengths = dict(zip(together, model.tokenize([part[j] for j in together])[1].tolist(), strict=True)) if together else {}
        lengths.update((j, int(model.tokenize([c])[1][0])) for j, c in enumerate(part) if j not in lengths)
        for j in range(len(part)):
            if lengths[j] > MAX_CAPTION_TOKENS:
                raise DataError(path, f"line {a + j + 1} has {lengths[j]} tokens; captions of at most "
                                      f"{MAX_CAPTION_TOKENS} are indexed (every caption row is stored as wide as "
                                      "the longest): shorten or split it")
        width = max(width, *lengths.values())
    return caps, width
