"""vlmatch.features.copyhash: a photo's copy signal survives resizing, recompression, small crops, turns and tone
changes, differs between different photos and between frames shifted 20 %, and marks near-blank photos."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlmatch.features.copyhash import copy_signal, distances, hash_table, rotations
from vlmatch.features.photo import load_image


def _scene(seed: int, w: int = 480, h: int = 320) -> Image.Image:
    """A photo-like picture: smooth light, a few shapes, texture."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(w, h)
    a = np.stack([np.sin(3 * x * rng.uniform(1, 3) + rng.uniform(0, 6)) * 60 + 120 + 60 * y * rng.uniform(-1, 1)
                  for _ in range(3)], axis=-1)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(20, 90)
        a[(np.mgrid[0:h, 0:w][1] - cx) ** 2 + (np.mgrid[0:h, 0:w][0] - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    a += rng.normal(0, 6, a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def _hash(im: Image.Image, quality: int = 90) -> str:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return copy_signal(load_image(io.BytesIO(buf.getvalue()), 224))["copy_hash"]


def _bits(a: str, b: str) -> int:
    return int(distances(hash_table([a, b]), np.array([0]), np.array([1]))[0])


@pytest.mark.parametrize("copy", [
    lambda im: im.resize((im.width // 2, im.height // 2)),
    lambda im: im.rotate(90, expand=True), lambda im: im.rotate(180), lambda im: im.rotate(270, expand=True),
    lambda im: im.crop((12, 8, im.width - 12, im.height - 8)),
    lambda im: im.point(lambda v: int(255 * (v / 255) ** 0.7)),  # a tone curve (an HDR twin's shadows lifted)
], ids=["half", "rot90", "rot180", "rot270", "crop5", "tone"])
def test_a_copy_stays_within_a_few_bits_of_its_photo(copy):
    im = _scene(0)
    assert _bits(_hash(im), _hash(copy(im), quality=60)) <= 10


def test_different_photos_and_a_frame_shifted_20_percent_are_far_apart():
    photos = [_hash(_scene(s)) for s in range(6)]
    assert min(_bits(a, b) for i, a in enumerate(photos) for b in photos[i + 1:]) >= 14
    im = _scene(7, 600, 320)
    left, right = im.crop((0, 0, 480, 320)), im.crop((120, 0, 600, 320))
    assert _bits(_hash(left), _hash(right)) >= 14


def test_the_four_turns_are_worked_out_from_the_bits_exactly():
    im = _scene(3, 320, 320)
    h = int(_hash(im), 16)
    turned = [int(_hash(im.rotate(a)), 16) for a in (0, 90, 180, 270)]  # square: the turns lose nothing
    got = rotations(h)
    assert all(min(bin(t ^ g).count("1") for g in got) <= 2 for t in turned)  # resampling: a bit or two
    assert len(set(got)) == 4


@pytest.mark.parametrize("pixels", [np.zeros((64, 96, 3)), np.full((64, 96, 3), 128.0),
                                    np.clip(12 + np.random.default_rng(0).normal(0, 2, (64, 96, 3)), 0, 255)])
def test_a_near_blank_photo_is_marked_flat_and_a_photo_is_not(pixels):
    assert copy_signal(pixels.astype(np.uint8)).get("copy_flat") is True
    assert "copy_flat" not in copy_signal(np.asarray(_scene(1)))
