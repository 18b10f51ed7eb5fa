"""A JPEG whose header claims more pixels than its data holds is refused in one line naming the file (it was
indexed as 8,125² of grey with the claimed size recorded), by ``vlmatch index build`` as by every reader, a DNG
whose preview is patched alike too; a JPEG that really is mid-grey, baseline or progressive, still reads."""

import io
import struct

import numpy as np
import pytest
from PIL import Image

from vlmatch.errors import DataError
from vlmatch.features.photo import load_image, open_photo

from .raw_files import tiff_raw


def photo_bytes(size=(500, 375), progressive=False) -> bytes:
    buf = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, "JPEG", quality=75, progressive=progressive)
    return buf.getvalue()


def claiming(data: bytes, w: int, h: int) -> bytes:
    """``data`` with its frame header's size patched to ``w`` x ``h`` (the data stays as it was)."""
    out = bytearray(data)
    at = next(i for i in range(2, len(out) - 1) if out[i] == 0xFF and out[i + 1] in (0xC0, 0xC1, 0xC2))
    out[at + 5:at + 9] = struct.pack(">HH", h, w)
    return bytes(out)


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("w, h, says", [(65000, 65000, "more than its"), (1000, 800, "its data ends before them"),
                                        (520, 400, "its data ends before them")])
def test_a_claimed_size_the_data_does_not_cover_is_refused(tmp_path, progressive, w, h, says):
    path = tmp_path / "claims.jpg"
    path.write_bytes(claiming(photo_bytes(progressive=progressive), w, h))
    for read in (lambda: load_image(path, 320), lambda: open_photo(path, 256), lambda: open_photo(path)):
        with pytest.raises(DataError) as e:
            read()
        msg = str(e.value)
        assert msg.startswith(str(path)) and "\n" not in msg
        # at full scale 65,000² is past the decode limit, refused by that first (PhotoTooLarge)
        assert (f"claims {w}x{h} pixels" in msg and says in msg) or f"has {w}x{h} pixels; the limit" in msg


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("grey", [128, 127])
def test_a_jpeg_that_is_mid_grey_reads(progressive, grey):
    """The flat grey a short scan decodes to, in a JPEG that really is that grey: looked at again, and read."""
    for mode, colour in (("RGB", (grey,) * 3), ("L", grey)):
        buf = io.BytesIO()
        Image.new(mode, (640, 480), colour).save(buf, "JPEG", progressive=progressive)
        assert load_image(buf.getvalue(), 320).shape == (320, 320, 3)
        assert open_photo(buf.getvalue()).size == (640, 480)


def test_a_photo_reads_as_it_did():
    data = photo_bytes()
    assert open_photo(data).size == (500, 375) and load_image(data, 320).shape == (320, 320, 3)


def test_a_dng_whose_preview_claims_more_is_refused_naming_the_dng(tmp_path):
    dng = tmp_path / "IMG_1.DNG"
    dng.write_bytes(tiff_raw(claiming(photo_bytes(), 1000, 800), how="strip"))
    with pytest.raises(DataError, match=r"IMG_1\.DNG: its header claims 1000x800 pixels, but its data ends"):
        load_image(dng, 320)
    dng.write_bytes(tiff_raw(photo_bytes(), how="strip"))
    assert load_image(dng, 320).shape == (320, 320, 3)
