"""A small photo index for search by photo and duplicates: drawn JPEG scenes, copies of some of them, and
an untrained *calibrated* VSE++ (the shipped default's kind: stage-1 vectors ``[v, -c(I), 1]``) on
EfficientNet-Lite0 features, built by ``vlmatch index build`` code. Untrained weights: rankings of distinct
scenes carry no meaning, but near-identical copies of a photo stay near it (a random projection of the
backbone's features keeps them close)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from .photo_index import SENTENCES, draw_photos


def rotated_with_tag(src: Path, dst: Path) -> None:
    """``src`` stored as a phone stores a portrait shot: pixels turned 90 degrees counter-clockwise and EXIF
    orientation 6, so a reader that applies the tag sees ``src`` upright."""
    with Image.open(src) as im:
        exif = Image.Exif()
        exif[0x0112] = 6
        im.convert("RGB").transpose(Image.Transpose.ROTATE_90).save(dst, quality=92, exif=exif)


def resized_copy(src: Path, dst: Path, scale: float = 0.6, quality: int = 70) -> None:
    with Image.open(src) as im:
        w, h = im.size
        im.convert("RGB").resize((round(w * scale), round(h * scale)), Image.LANCZOS).save(dst, quality=quality)


def save_vse(folder: Path, calibrated: bool = True) -> Path:
    import torch

    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab
    from vlmatch.models.calibration import Calibration

    vocab = Vocab.build(SENTENCES, 1)
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=1280, embed_dim=32, word_dim=16, vocab_size=len(vocab))
    m.vocab = vocab
    if calibrated:
        g = torch.Generator().manual_seed(1)
        m.calibration = Calibration.fit(15.0, rank=8, text=torch.nn.functional.normalize(torch.randn(24, 32, generator=g)),
                                        image=torch.nn.functional.normalize(torch.randn(24, 32, generator=g)))
    return m.save(folder)


def build_like_index(root: Path, n: int = 8) -> Path:
    """Photos photo_000 .. photo_{n-1}; photo_000's copies copy_small.jpg (60 %, quality 70) and
    copy_q40.jpg (re-encoded at quality 40); photo_001 rotated with a tag: photo_001_rot.jpg."""
    from vlmatch.search.build import build_index

    photos = draw_photos(root / "photos", n)
    resized_copy(photos / "photo_000.jpg", photos / "copy_small.jpg")
    with Image.open(photos / "photo_000.jpg") as im:
        im.save(photos / "copy_q40.jpg", quality=40)
    rotated_with_tag(photos / "photo_001.jpg", photos / "photo_001_rot.jpg")
    build_index(root / "index", save_vse(root / "vse"), images=photos, backbone="efficientnet-lite0", progress=False)
    return root / "index"


_BUILT: dict = {}


@pytest.fixture(scope="session")
def like_index(tmp_path_factory) -> Path:
    """The index folder of :func:`build_like_index` (built once per test session)."""
    if "index" not in _BUILT:
        _BUILT["index"] = build_like_index(tmp_path_factory.mktemp("like_index"))
    return _BUILT["index"]
