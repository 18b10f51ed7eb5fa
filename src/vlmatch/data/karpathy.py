"""Karpathy-style JSON (``dataset_{flickr8k,flickr30k,coco}.json``): images, splits (mapped to the precomp names:
``restval`` -> ``train``, ``val`` -> ``dev``) and raw captions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..io import read_json

SPLIT_NAMES = {"train": "train", "restval": "train", "val": "dev", "test": "test"}


@dataclass
class KarpathyImage:
    path: str  # relative to the image folder (COCO: filepath/filename)
    split: str  # precomp split name
    captions: list[str]


def read_karpathy(path, captions_per_image: int = 5) -> dict[str, list[KarpathyImage]]:
    """Images grouped by precomp split, each with exactly ``captions_per_image`` raw captions."""
    path = Path(path)
    obj = read_json(path, "annotation file not found")
    if not isinstance(obj, dict) or not isinstance(obj.get("images"), list):
        raise DataError(path, "expected a Karpathy JSON object with an 'images' list")
    out: dict[str, list[KarpathyImage]] = {}
    for n, im in enumerate(obj["images"]):
        try:
            fname, split, sents = im["filename"], im["split"], im["sentences"]
        except (KeyError, TypeError):
            raise DataError(path, f"images[{n}] lacks filename, split or sentences") from None
        if split not in SPLIT_NAMES:
            raise DataError(path, f"images[{n}] ({fname}) has unknown split {split!r}; expected {sorted(SPLIT_NAMES)}")
        caps = [str(s.get("raw", "")).strip() for s in sents if isinstance(s, dict)]
        caps = [c for c in caps if c]
        if len(caps) < captions_per_image:
            raise DataError(path, f"images[{n}] ({fname}) has {len(caps)} non-empty captions, "
                                  f"needs {captions_per_image}")
        rel = str(Path(im.get("filepath", "")) / fname) if im.get("filepath") else fname
        out.setdefault(SPLIT_NAMES[split], []).append(KarpathyImage(rel, SPLIT_NAMES[split], caps[:captions_per_image]))
    return out
