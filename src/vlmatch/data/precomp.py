"""SCAN's "precomp" format: ``{split}_ims.npy`` (N, k, D), memory-mapped (COCO train is 33 GB), ``{split}_caps.txt``
(caption i belongs to image ``i // per``) and ``{split}_ids.txt``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io import read_npy


def read_caption_lines(path) -> list[str]:
    """One caption per line, strictly UTF-8 and non-empty; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "caption file not found")
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for no, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise DataError(path, f"line {no} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if not text.strip():
            raise DataError(path, f"line {no} is an empty caption")
        out.append(text.strip())
    if not out:
        raise DataError(path, "no captions")
    return out


def open_features(path) -> np.ndarray:
    """Memory-map a (N, k, D) feature array, checking rank and dtype."""
    path = Path(path)
    arr = read_npy(path, "feature file", mmap_mode="r")
    if arr.ndim != 3:
        raise DataError(path, f"features must have rank 3 (n_images, n_regions, dim), got shape {arr.shape}")
    if arr.dtype.kind != "f":
        raise DataError(path, f"features must be floating point, got dtype {arr.dtype}")
    if 0 in arr.shape:
        raise DataError(path, f"features are empty (shape {arr.shape})")
    return arr


def available_splits(root) -> list[str]:
    """Names of the splits a precomp folder holds (``{split}_ims.npy``; mirror views are not a split)."""
    return sorted(p.name[: -len("_ims.npy")] for p in Path(root).glob("*_ims.npy") if not p.name.endswith("_mirror_ims.npy"))


def split_hint(root, split: str) -> str:
    """'; this folder has ...: use --split X' for a split that is not there."""
    have = available_splits(root)
    if not have:
        return "; no {split}_ims.npy in this folder at all (is it a precomp folder?)"
    alias = {"val": "dev", "dev": "val", "validation": "dev", "testall": "test"}.get(split)
    if alias in have:
        why = " (the precomp layout calls Karpathy's val split 'dev')" if alias == "dev" else ""
        return f"; this folder has splits {', '.join(have)}: use --split {alias}{why}"
    return f"; this folder has splits {', '.join(have)}"


def _finite(features, i: int, path) -> np.ndarray:
    x = np.asarray(features[i], dtype=np.float32)
    if not np.isfinite(x).all():
        raise DataError(path, f"image {i} has NaN or inf features")
    return x


class PrecompSplit:
    """One split of a precomp folder: memory-mapped features, captions and (optional) ids; ``max_images`` keeps the
    first images and their captions."""

    def __init__(self, root, split: str, max_images: int | None = None):
        self.root = Path(root)
        self.split = split
        self.features_path = self.root / f"{split}_ims.npy"
        self.captions_path = self.root / f"{split}_caps.txt"
        if not self.root.is_dir():
            raise DataError(self.root, "data folder not found")
        if not self.features_path.is_file():
            raise DataError(self.features_path, "feature file not found" + split_hint(self.root, split))
        self.features = open_features(self.features_path)
        self.captions = read_caption_lines(self.captions_path)
        n_img, n_cap = len(self.features), len(self.captions)
        if n_cap % n_img:
            raise DataError(self.captions_path, f"{n_cap} captions is not a multiple of the {n_img} images "
                                                f"in {self.features_path.name}")
        self.per_image = n_cap // n_img
        ids_path = self.root / f"{split}_ids.txt"
        self.ids = read_caption_lines(ids_path) if ids_path.is_file() else None
        if self.ids is not None and len(self.ids) not in (n_img, n_cap):
            raise DataError(ids_path, f"{len(self.ids)} ids, expected one per image ({n_img}) or per caption")
        if self.ids is not None and len(self.ids) == n_cap:  # SCAN writes one id per caption
            self.ids = self.ids[:: self.per_image]
        if max_images is not None and max_images < n_img:
            self.features = self.features[:max_images]
            self.captions = self.captions[: max_images * self.per_image]
            self.ids = None if self.ids is None else self.ids[:max_images]

    def keep_images(self, keep) -> None:
        """Keep, in memory, only the images where ``keep`` (a boolean per image) is true, with captions and ids."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.n_images,):
            raise ValueError(f"keep_images: {keep.shape[0]} flags for {self.n_images} images")
        rows = np.flatnonzero(keep)
        self.features = np.ascontiguousarray(self.features[rows])
        self.captions = [c for i in rows for c in self.captions[i * self.per_image:(i + 1) * self.per_image]]
        self.ids = None if self.ids is None else [self.ids[i] for i in rows]

    @property
    def n_images(self) -> int:
        return len(self.features)

    @property
    def n_regions(self) -> int:
        return self.features.shape[1]

    @property
    def img_dim(self) -> int:
        return self.features.shape[2]

    def image(self, i: int) -> np.ndarray:
        return _finite(self.features, i, self.features_path)

    @property
    def mirror_path(self) -> Path:
        """Where ``features extract --mirror`` writes the split's mirror-view features."""
        return self.root / f"{self.split}_mirror_ims.npy"

    def mirror_image(self, i: int) -> np.ndarray:
        """Image ``i``'s features of its mirror view (``{split}_mirror_ims.npy``, opened on first use)."""
        if getattr(self, "_mirror", None) is None:
            if not self.mirror_path.is_file():
                raise DataError(self.mirror_path, "mirror-view features not found (vlmatch features extract ... "
                                                  "--mirror writes them)")
            mirror = open_features(self.mirror_path)
            if mirror.shape[1:] != self.features.shape[1:] or len(mirror) < self.n_images:
                raise DataError(self.mirror_path, f"shape {tuple(mirror.shape)} does not match the split's "
                                                  f"{tuple(self.features.shape)}")
            self._mirror = mirror
        return _finite(self._mirror, i, self.mirror_path)

    def image_of_caption(self, j: int) -> int:
        return j // self.per_image

    def check_all_finite(self, chunk_bytes: int = 64 << 20, progress: bool = False) -> None:
        """Scan every feature for NaN/inf: one streamed pass over the memory map, ``chunk_bytes`` at a time."""
        from tqdm.auto import tqdm

        per_image = max(1, self.features[0].nbytes)
        chunk = max(1, chunk_bytes // per_image)
        with tqdm(total=self.n_images, desc=f"checking {self.split} features", unit="img", leave=False,
                  disable=not progress) as bar:
            for a in range(0, self.n_images, chunk):
                block = np.asarray(self.features[a:a + chunk])
                bad = ~np.isfinite(block).reshape(len(block), -1).all(axis=1)
                if bad.any():
                    raise DataError(self.features_path, f"image {a + int(np.argmax(bad))} has NaN or inf features "
                                                        f"(found by the check at start; fix or drop that image)")
                bar.update(len(block))
