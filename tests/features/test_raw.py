"""Camera RAW files: told apart from TIFF, read through their embedded JPEG, paired with their JPEG."""

import pytest

from vlmatch.features import photo
from vlmatch.features.raw import NoPreview, embedded_jpeg, pair_raws

from .raw_files import jpeg_bytes, raf, tiff_raw


@pytest.mark.parametrize("how", ["ifd1", "subifd", "strip"])
def test_a_raw_reads_as_its_embedded_jpeg_not_as_a_tiff(tmp_path, how):
    p = tmp_path / "shot.nef"
    p.write_bytes(tiff_raw(jpeg_bytes(), how))
    assert photo.sniff(p.read_bytes()[:32], p) == "RAW"
    assert photo.sniff(p.read_bytes()[:32]) == "TIFF"  # the bytes alone are a TIFF's: the suffix tells
    im = photo.open_photo(p)
    assert im.size == (96, 64) and im.getpixel((80, 50))[0] > 150  # the preview, not the 4 x 4 sensor strip


def test_raw_headers_of_their_own_and_cr2_are_raw_by_their_bytes(tmp_path):
    assert photo.sniff(tiff_raw(jpeg_bytes(), canon=True)[:32]) == "RAW"  # CR2: 'CR' after the TIFF header
    assert photo.sniff(tiff_raw(jpeg_bytes(), magic=b"IIRO")[:32]) == "RAW"  # ORF
    assert photo.sniff(tiff_raw(jpeg_bytes(), magic=b"IIU\x00")[:32]) == "RAW"  # RW2
    data = raf(jpeg_bytes((64, 48)))
    assert photo.sniff(data[:32]) == "RAW"
    assert photo.open_photo(data).size == (64, 48)
    assert photo.open_photo(tiff_raw(jpeg_bytes(), magic=b"IIRO")).size == (96, 64)


def test_the_raws_orientation_turns_a_preview_that_records_none(tmp_path):
    p = tmp_path / "portrait.cr2"
    p.write_bytes(tiff_raw(jpeg_bytes(), orientation=6, canon=True))
    assert photo.open_photo(p).size == (64, 96)
    q = tmp_path / "own.cr2"  # a preview with its own tag: that one rules (applied once, not twice)
    q.write_bytes(tiff_raw(jpeg_bytes(orientation=6), orientation=6, canon=True))
    assert photo.open_photo(q).size == (64, 96)


def test_a_raw_without_a_preview_is_one_line_naming_the_file(tmp_path):
    p = tmp_path / "bare.dng"
    p.write_bytes(tiff_raw(None))
    assert embedded_jpeg(p.read_bytes()) is None
    with pytest.raises(NoPreview, match=r"bare.dng: a camera RAW with no embedded JPEG preview"):
        photo.open_photo(p)


def test_a_raw_beside_the_jpeg_of_the_same_shot_is_one_photo():
    kept, pairs = pair_raws(["a/IMG_1.CR2", "a/IMG_1.JPG", "a/IMG_2.nef", "b/IMG_1.cr2", "c.jpg"])
    assert kept == ["a/IMG_1.JPG", "a/IMG_2.nef", "b/IMG_1.cr2", "c.jpg"]
    assert pairs == [{"raw": "a/IMG_1.CR2", "jpeg": "a/IMG_1.JPG"}]


def test_a_raws_size_is_its_previews_as_displayed():
    """What a table row records as the RAW's pixels: the preview's size (not the first IFD's sensor strip or
    thumbnail), turned by the preview's own orientation, else the RAW's."""
    from vlmatch.features.photo import preview_pixels

    assert preview_pixels(tiff_raw(jpeg_bytes((96, 64)))) == [96, 64]
    assert preview_pixels(tiff_raw(jpeg_bytes((96, 64)), orientation=6, canon=True)) == [64, 96]
    assert preview_pixels(tiff_raw(jpeg_bytes((96, 64), orientation=8), orientation=1, canon=True)) == [64, 96]
    assert preview_pixels(raf(jpeg_bytes((64, 48)))) == [64, 48]
    assert preview_pixels(tiff_raw(None)) is None
