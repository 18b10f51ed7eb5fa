"""A small real index for the service tests: a folder of drawn JPEG "photos", an untrained SCAN t-i
(EfficientNet-Lite0 features, 1280-d) with a VSE++ retriever, built by ``vlmatch index build`` code.

The models are untrained, so rankings carry no meaning; every step (feature extraction, stage 1,
stage-2 re-scoring, attention, heat maps) is the real one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

SRC = str(Path(__file__).resolve().parents[2] / "src")


def vlmatch(*argv, ok: bool = True):
    """``vlmatch ARGV`` in a process of its own, as a user runs it, on this checkout's package; with ``ok`` its exit
    status must be 0."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "vlmatch.cli", *argv], capture_output=True, text=True, env=env,
                         timeout=600)
    if ok:
        assert out.returncode == 0, out.stderr[-2000:]
    return out


SENTENCES = ["a dog on the grass", "a red ball in the park", "two people walk on the beach at sunset",
             "a blue car on a street", "a cat sleeps on a sofa", "children play in the snow"]
SKIES = [(135, 190, 235), (250, 170, 110), (200, 200, 210), (40, 50, 90)]
GROUNDS = [(90, 160, 70), (220, 200, 150), (240, 240, 245), (110, 110, 115)]
THINGS = [(200, 40, 40), (40, 80, 200), (240, 200, 40), (120, 70, 40), (30, 30, 30), (250, 250, 250)]


def draw_photos(folder: Path, n: int, seed: int = 0) -> Path:
    """``n`` JPEGs of simple scenes: sky, ground, one to three coloured shapes (sizes vary)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = (320, 240) if i % 3 else (240, 320)
        im = Image.new("RGB", (w, h), SKIES[i % len(SKIES)])
        d = ImageDraw.Draw(im)
        horizon = int(h * rng.uniform(0.45, 0.7))
        d.rectangle([0, horizon, w, h], fill=GROUNDS[(i // 2) % len(GROUNDS)])
        for _ in range(int(rng.integers(1, 4))):
            x, y, r = int(rng.integers(20, w - 20)), int(rng.integers(horizon - 40, h - 20)), int(rng.integers(12, 50))
            fill = THINGS[int(rng.integers(len(THINGS)))]
            (d.ellipse if rng.random() < 0.5 else d.rectangle)([x - r, y - r, x + r, y + r], fill=fill)
        im.save(folder / f"photo_{i:03d}.jpg", quality=88)
    return folder


def save_models(folder: Path) -> dict[str, Path]:
    import torch

    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    vocab = Vocab.build(SENTENCES, 1)
    out = {}
    for key, name in (("model", "scan_t2i_avg"), ("retriever", "vsepp")):
        torch.manual_seed(0)
        m = create_model(name, img_dim=1280, embed_dim=32, word_dim=16, vocab_size=len(vocab))
        m.vocab = vocab
        out[key] = m.save(folder / key)
    return out


def build_photo_index(root: Path, n: int = 16) -> Path:
    from vlmatch.search.build import build_index

    ck = save_models(root / "ckpt")
    captions = root / "captions.txt"
    captions.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    build_index(root / "index", ck["model"], images=draw_photos(root / "photos", n), captions=captions,
                retriever_ckpt=ck["retriever"], backbone="efficientnet-lite0", progress=False)
    return root / "index"


_BUILT: dict = {}


@pytest.fixture(scope="session")
def photo_index(tmp_path_factory) -> Path:
    """The index folder (built once per test session, whichever module asks first)."""
    if "index" not in _BUILT:
        _BUILT["index"] = build_photo_index(tmp_path_factory.mktemp("photo_index"))
    return _BUILT["index"]
