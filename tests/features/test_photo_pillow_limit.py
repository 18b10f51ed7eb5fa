"""vlmatch reads photos past Pillow's decompression-bomb check without turning it off for the process:
``PIL.Image.MAX_IMAGE_PIXELS`` is what the application set, before and after vlmatch reads a photo over it, and
the application's own reads keep their limit while vlmatch decodes on other threads."""

from __future__ import annotations

import io
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from vlmatch.features import photo

from .test_photo import flat_grey_jpeg


@pytest.mark.slow  # a 201-megapixel photo
def test_reading_a_201_megapixel_photo_leaves_pillows_limit_as_it_was(tmp_path):
    """In a fresh interpreter: import vlmatch and its readers, read a photo past Pillow's limit every way vlmatch
    reads one (the pixels, the model's input, the orientation, an index row's EXIF), and the limit is Pillow's
    default still; Pillow's own Image.open of the same file is still refused."""
    path = tmp_path / "huge.jpg"
    path.write_bytes(flat_grey_jpeg(16384, 12288))  # 201 M pixels: over 2 x Pillow's default limit (179 M)
    code = f"""
import PIL.Image as Image
default = Image.MAX_IMAGE_PIXELS
import vlmatch, vlmatch.features.photo as photo, vlmatch.search.inputs as build
from pathlib import Path
path = Path({str(path)!r})
assert photo.open_photo(path, 320).size == (2048, 1536)
assert photo.load_image(path, 64).shape == (64, 64, 3)
assert photo.file_orientation(path) == 1
row = build.photo_row(path.read_bytes(), path)
assert row["pixels"] == [16384, 12288] and "notes" not in row, row
assert Image.MAX_IMAGE_PIXELS == default == int(1024 * 1024 * 1024 // 4 // 3), Image.MAX_IMAGE_PIXELS
try:
    Image.open(path)
except Image.DecompressionBombError:
    print("refused")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["refused"]


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_the_applications_limit_holds_while_vlmatch_decodes_on_other_threads(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5_000)  # an application's own, far lower limit
    data = _png(200, 200)  # 40 k pixels: over twice that limit
    with ThreadPoolExecutor(4) as pool:
        reads = [pool.submit(photo.open_photo, data, name=f"p{i}.png") for i in range(24)]
        refused = 0
        for _ in range(24):  # the application's reads, meanwhile
            with pytest.raises(Image.DecompressionBombError):
                Image.open(io.BytesIO(data))
            refused += 1
        assert all(r.result().size == (200, 200) for r in reads) and refused == 24
    assert Image.MAX_IMAGE_PIXELS == 5_000


def test_vlmatchs_own_pixel_limit_still_refuses(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5_000)
    with pytest.raises(photo.PhotoTooLarge, match="has 200x200 pixels; the limit is 1000 pixels"):
        photo.open_photo(_png(200, 200), name="a.png", max_pixels=1000)


def test_content_no_opener_knows_goes_through_image_open():
    with pytest.raises(Image.UnidentifiedImageError):
        photo.open_image(io.BytesIO(b"not an image at all, only text" * 4))
    with pytest.raises(Image.UnidentifiedImageError):  # a PNG signature over garbage: Pillow's own error, as before
        photo.open_image(io.BytesIO(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64))
