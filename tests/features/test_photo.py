"""The photo reader (vlmatch.features.photo): every photo as it is displayed -- EXIF orientation, formats
read from the content, colour modes, first frames -- with files the tests write themselves."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageDraw

from vlmatch.errors import DataError
from vlmatch.features import photo
from vlmatch.features.photo import EXIF_ORIENTATION, ORIENTATION_OPS, load_image, open_photo, sniff

# the stored pixels of a photo whose EXIF orientation is o are the upright photo turned by the inverse of
# ORIENTATION_OPS[o] (the flips and the two transposes are their own inverses; 90 and 270 swap)
INVERSE = {None: None, "ROTATE_90": "ROTATE_270", "ROTATE_270": "ROTATE_90"}


def upright_photo(w: int = 96, h: int = 64) -> Image.Image:
    """A landscape test card no flip or rotation leaves unchanged: a red block top-left, a blue bar at the
    bottom, a horizontal grey ramp."""
    ramp = np.tile(np.linspace(40, 220, w, dtype=np.uint8)[None, :, None], (h, 1, 3))
    im = Image.fromarray(ramp)
    d = ImageDraw.Draw(im)
    d.rectangle([4, 4, w // 3, h // 3], fill=(220, 30, 30))
    d.rectangle([0, h - 10, w - 1, h - 1], fill=(30, 40, 200))
    return im


def stored_as(im: Image.Image, orientation: int) -> Image.Image:
    op = ORIENTATION_OPS[orientation]
    inv = INVERSE.get(op, op)
    return im if inv is None else im.transpose(getattr(Image.Transpose, inv))


def jpeg_bytes(im: Image.Image, orientation: int | None = None, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    if orientation is None:
        im.save(buf, "JPEG", quality=quality)
    else:
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        im.save(buf, "JPEG", quality=quality, exif=exif.tobytes())
    return buf.getvalue()


def mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_reads_as_the_upright_photo(tmp_path, orientation):
    up = upright_photo()
    want = load_image(jpeg_bytes(up), 48)
    stored = stored_as(up, orientation)
    path = tmp_path / f"o{orientation}.jpg"
    path.write_bytes(jpeg_bytes(stored, orientation))
    got = load_image(path, 48)
    assert mad(got, want) < 3.0  # JPEG noise only
    assert open_photo(path).size == up.size  # the displayed size: 5..8 swap the stored width and height
    if orientation != 1:  # the stored pixels are another picture: the reader did turn them
        assert mad(np.asarray(stored.convert("RGB").resize((48, 48))), want) > 20


def test_a_large_jpeg_decodes_at_a_reduced_scale_upright(tmp_path):
    big = upright_photo(1600, 1200)
    path = tmp_path / "big.jpg"
    path.write_bytes(jpeg_bytes(stored_as(big, 6), 6))
    im = open_photo(path, 200)
    assert im.size == (400, 300)  # 1/4 scale still covers 200 x 200; turned upright after the scaled decode
    assert mad(load_image(path, 64), load_image(jpeg_bytes(big), 64)) < 3.0


@pytest.mark.parametrize("bad", [0, 9, 65535])
def test_an_absurd_orientation_reads_as_stored_without_a_crash(tmp_path, bad):
    up = upright_photo()
    path = tmp_path / "odd.jpg"
    path.write_bytes(jpeg_bytes(up, bad))
    assert mad(load_image(path, 48), load_image(jpeg_bytes(up), 48)) < 3.0


@pytest.mark.parametrize("type_code", [2, 7, 12])  # ASCII, UNDEFINED, DOUBLE instead of SHORT
def test_an_orientation_of_the_wrong_type_reads_as_stored(tmp_path, type_code):
    up = upright_photo()
    data = bytearray(jpeg_bytes(up, 6))
    for entry, order in ((b"\x12\x01\x03\x00", "little"), (b"\x01\x12\x00\x03", "big")):  # tag 0x0112, SHORT
        at = data.find(entry)
        if at > 0:
            data[at + 2:at + 4] = type_code.to_bytes(2, order)
            break
    assert at > 0
    assert mad(load_image(bytes(data), 48), load_image(jpeg_bytes(up), 48)) < 3.0


def test_a_corrupt_exif_block_does_not_stop_the_photo(tmp_path):
    data = bytearray(jpeg_bytes(upright_photo(), 6))
    at = data.find(b"Exif\x00\x00")
    assert at > 0
    data[at + 6:at + 14] = b"XX\x00\x00\xff\xff\xff\xff"  # neither II nor MM: an unreadable TIFF header
    px = load_image(bytes(data), 32)
    assert px.shape == (32, 32, 3)


def colour_photo(mode: str) -> Image.Image:
    rgb = upright_photo(40, 30)
    if mode == "CMYK":
        return rgb.convert("CMYK")
    if mode == "L":
        return rgb.convert("L")
    if mode == "1":
        return rgb.convert("1")
    if mode == "P":
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    raise AssertionError(mode)


@pytest.mark.parametrize("mode,fmt", [("CMYK", "JPEG"), ("CMYK", "TIFF"), ("L", "PNG"), ("1", "PNG"), ("P", "GIF"),
                                      ("P", "BMP")])
def test_colour_modes_read_as_8_bit_rgb(tmp_path, mode, fmt):
    src = colour_photo(mode)
    path = tmp_path / f"x.{fmt.lower()}"
    src.save(path, fmt)
    im = open_photo(path)
    assert im.mode == "RGB" and im.size == (40, 30)
    want = np.asarray(src.convert("RGB"))
    assert mad(np.asarray(im), want) < 4.0


def test_transparency_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (20, 10), (255, 0, 0, 255))
    rgba.paste((0, 0, 255, 0), (10, 0, 20, 10))  # right half fully transparent (blue that is not shown)
    rgba.save(tmp_path / "a.png")
    px = np.asarray(open_photo(tmp_path / "a.png"))
    assert tuple(px[5, 2]) == (255, 0, 0) and tuple(px[5, 15]) == (255, 255, 255)
    la = Image.new("LA", (10, 10), (0, 0))  # black, fully transparent
    la.save(tmp_path / "la.png")
    assert np.asarray(open_photo(tmp_path / "la.png")).min() == 255
    pal = Image.new("P", (10, 10), 0)
    pal.putpalette([0, 0, 0, 200, 0, 0] + [0] * 762)
    pal.paste(1, (0, 0, 5, 10))
    pal.save(tmp_path / "p.png", transparency=0)  # index 0 (black) is transparent
    px = np.asarray(open_photo(tmp_path / "p.png"))
    assert tuple(px[5, 2]) == (200, 0, 0) and tuple(px[5, 8]) == (255, 255, 255)


def test_16_bit_colour_depths_are_scaled(tmp_path):
    grey = np.linspace(0, 65535, 16 * 16).reshape(16, 16).astype(np.uint16)
    Image.fromarray(grey).save(tmp_path / "deep.tif")
    px = np.asarray(open_photo(tmp_path / "deep.tif"))
    np.testing.assert_allclose(px[..., 0], np.rint(grey / 257.0), atol=1)


@pytest.mark.parametrize("fmt", ["GIF", "WEBP"])
def test_an_animation_reads_as_its_first_frame(tmp_path, fmt):
    frames = [Image.new("RGB", (16, 16), c) for c in ((250, 0, 0), (0, 250, 0), (0, 0, 250))]
    path = tmp_path / f"anim.{fmt.lower()}"
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    with Image.open(path) as im:
        assert im.n_frames == 3
    px = np.asarray(open_photo(path))
    assert px[..., 0].mean() > 200 and px[..., 1].mean() < 40


def heic_bytes(im: Image.Image, orientation: int | None = None) -> bytes:
    pytest.importorskip("pillow_heif")
    photo.decoder_available("HEIF")
    buf = io.BytesIO()
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        kw["exif"] = exif.tobytes()
    im.save(buf, "HEIF", quality=95, **kw)
    return buf.getvalue()


def test_a_heic_photo_reads_upright_whatever_its_name(tmp_path):
    up = upright_photo()
    data = heic_bytes(stored_as(up, 6), 6)
    assert sniff(data[:32]) == "HEIF"
    want = load_image(jpeg_bytes(up), 48)
    for name in ("phone.heic", "phone.HEIF", "really_a_heic.jpg", "no_suffix"):
        (tmp_path / name).write_bytes(data)
        assert mad(load_image(tmp_path / name, 48), want) < 4.0, name


def test_a_missing_heic_decoder_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    data = heic_bytes(upright_photo())
    (tmp_path / "a.heic").write_bytes(data)
    monkeypatch.setattr(photo, "decoder_available", lambda fmt: False)
    with pytest.raises(photo.MissingDecoder, match=r"a\.heic: a HEIF photo, and no HEIF decoder is installed: "
                                                   r"pip install 'vlmatch\[vision\]'"):
        load_image(tmp_path / "a.heic", 32)


@pytest.mark.parametrize("head,fmt", [(b"\xff\xd8\xff\xe0", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF89a", "GIF"),
                                      (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WEBP"), (b"II*\x00", "TIFF"),
                                      (b"MM\x00*", "TIFF"), (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00", "HEIF"),
                                      (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00mif1", "AVIF"),
                                      (b"\x00\x00\x00\x18ftypisom\x00\x00\x00\x00", None),  # an MP4 video
                                      (b"hello world", None), (b"", None)])
def test_the_format_is_read_from_the_content(head, fmt):
    assert sniff(head.ljust(14, b"\x00") if head else head) == fmt


def test_a_broken_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "cut.jpg").write_bytes(jpeg_bytes(upright_photo())[:200])
    with pytest.raises(DataError, match=r"cut\.jpg: unreadable image"):
        load_image(tmp_path / "cut.jpg", 32)
    (tmp_path / "text.jpg").write_text("not a photo")
    with pytest.raises(DataError, match=r"text\.jpg: unreadable image"):
        load_image(tmp_path / "text.jpg", 32)


def test_a_pixel_limit_refuses_before_decoding(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    upright_photo(300, 200).save(tmp_path / "a.png")
    with pytest.raises(photo.PhotoTooLarge, match=r"has 300x200 pixels; the limit is 1000 pixels"):
        open_photo(tmp_path / "a.png", max_pixels=1000)


def test_file_orientation_reads_the_tag_only(tmp_path):
    (tmp_path / "t.jpg").write_bytes(jpeg_bytes(upright_photo(), 8))
    (tmp_path / "u.jpg").write_bytes(jpeg_bytes(upright_photo()))
    (tmp_path / "x.jpg").write_text("nope")
    assert photo.file_orientation(tmp_path / "t.jpg") == 8
    assert photo.file_orientation(tmp_path / "u.jpg") == 1
    assert photo.file_orientation(tmp_path / "x.jpg") == 1


def flat_grey_jpeg(w: int, h: int) -> bytes:
    """A valid greyscale baseline JPEG of ``w`` x ``h`` (multiples of 32 wide), every block mid-grey: the header
    of one Pillow writes (its standard Huffman tables), the size patched, and the scan written out by hand --
    each 8 x 8 block is DC difference 0 ('00') then end-of-block ('1010'), four blocks in three bytes."""
    import io
    import struct

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (16, 16), 128).save(buf, "JPEG", quality=90)
    raw = bytearray(buf.getvalue())
    at = raw.index(b"\xff\xc0") + 5
    raw[at:at + 4] = struct.pack(">HH", h, w)
    sos = raw.index(b"\xff\xda")
    header_end = sos + 2 + int.from_bytes(raw[sos + 2:sos + 4], "big")
    blocks = (w // 8) * (h // 8)
    return bytes(raw[:header_end]) + b"\x28\xa2\x8a" * (blocks // 4) + b"\xff\xd9"


def test_a_200_megapixel_jpeg_decodes_at_a_reduced_scale_and_a_png_as_large_is_refused(tmp_path):
    """Pillow's decompression-bomb check (on the file's claimed size) is replaced by a limit on the pixels
    decoded: a JPEG past 179 M pixels opens at 1/8 scale; a PNG claiming as many is refused in one line."""
    import struct
    import zlib

    from PIL import Image

    # a 16384 x 12288 (201 M pixel) JPEG costs seconds to encode: one written by hand, flat grey, whose data
    # covers its size (a header claiming more than the data holds is refused: test_jpeg_data)
    (tmp_path / "huge.jpg").write_bytes(flat_grey_jpeg(16384, 12288))
    assert open_photo(tmp_path / "huge.jpg", 320).size == (2048, 1536)  # 1/8 scale: 3 M pixels decoded
    with pytest.raises(photo.PhotoTooLarge, match=r"huge.jpg: has 16384x12288 pixels"):
        open_photo(tmp_path / "huge.jpg", max_pixels=100_000_000)  # at full scale: refused before decoding
    Image.new("L", (1, 1)).save(tmp_path / "bomb.png")
    png = bytearray((tmp_path / "bomb.png").read_bytes())
    ihdr = png[12:29]
    ihdr[4:12] = struct.pack(">II", 20000, 20000)
    png[12:29] = ihdr
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    (tmp_path / "bomb.png").write_bytes(bytes(png))
    with pytest.raises(photo.PhotoTooLarge, match=r"bomb.png: has 20000x20000 pixels; the limit is 256000000"):
        open_photo(tmp_path / "bomb.png")


def test_a_real_large_jpeg_reads_through_draft(tmp_path):
    from PIL import Image

    Image.new("RGB", (6000, 4000), (120, 30, 200)).save(tmp_path / "big.jpg", quality=80)
    im = open_photo(tmp_path / "big.jpg", 320, max_pixels=2_000_000)  # 24 M stored, 375 k decoded (1/8)
    assert im.size == (750, 500)


@pytest.mark.slow  # a large HEIC encode
def test_a_heic_with_a_large_enough_thumbnail_is_read_through_it(tmp_path):
    """The model sees essentially the same pixels (the thumbnail is the same photo, smaller); a thumbnail
    smaller than the model's input is not used; orientation stays the container's."""
    pytest.importorskip("pillow_heif")
    photo.decoder_available("HEIF")
    up = upright_photo(640, 480)
    up.save(tmp_path / "t.heic", quality=90, thumbnails=[400])  # a 400 x 300 thumbnail
    up.save(tmp_path / "plain.heic", quality=90, thumbnails=[])
    assert open_photo(tmp_path / "t.heic", 224).size == (400, 300)  # covers 224 x 224: the thumbnail
    assert open_photo(tmp_path / "t.heic", 320).size == (640, 480)  # 300 < 320: the full photo
    assert open_photo(tmp_path / "t.heic").size == (640, 480)
    thumb, full = load_image(tmp_path / "t.heic", 224), load_image(tmp_path / "plain.heic", 224)
    assert mad(thumb, full) < 3.0
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    stored_as(up, 6).save(tmp_path / "r.heic", quality=90, thumbnails=[400], exif=exif.tobytes())
    assert mad(load_image(tmp_path / "r.heic", 224), full) < 6.0  # upright through the thumbnail too


@pytest.mark.slow  # two HEVC encodes of a 1600 x 1200 photo
def test_the_models_input_reads_an_iphone_sized_thumbnail(tmp_path, monkeypatch):
    """An iPhone writes a 320 x 240 thumbnail: short of a 320 x 320 input on one side, yet within
    MODEL_THUMB_COVER of it, so the model's input reads it (the full HEVC decode is most of a build's cost);
    what a person sees (open_photo at full cover) still decodes the photo."""
    pytest.importorskip("pillow_heif")
    photo.decoder_available("HEIF")
    up = upright_photo(1600, 1200)
    up.save(tmp_path / "iphone.heic", quality=90, thumbnails=[320])  # 320 x 240
    up.save(tmp_path / "plain.heic", quality=90, thumbnails=[])
    assert open_photo(tmp_path / "iphone.heic", 320).size == (1600, 1200)
    assert open_photo(tmp_path / "iphone.heic", 320, cover=photo.MODEL_THUMB_COVER).size == (320, 240)
    assert open_photo(tmp_path / "iphone.heic", 480, cover=photo.MODEL_THUMB_COVER).size == (1600, 1200)  # 240 < 360
    seen = []
    real = photo.open_photo

    def recorded(*a, **k):
        im = real(*a, **k)
        seen.append(im.size)
        return im

    monkeypatch.setattr(photo, "open_photo", recorded)
    thumb = photo.load_image(tmp_path / "iphone.heic", 320)
    assert seen == [(320, 240)]
    assert mad(thumb, load_image(tmp_path / "plain.heic", 320)) < 4.0
