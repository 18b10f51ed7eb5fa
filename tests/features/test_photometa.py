"""When, where, what and how large: EXIF written by the test comes back from the file; broken EXIF leaves
that field empty with a note, never an exception."""

from __future__ import annotations

import pytest
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

from vlmatch.features.photometa import meta_from_exif, photo_meta

from .photo_exif import save_photo


def _meta(path):
    with Image.open(path) as im:
        return photo_meta(im)


def test_date_offset_camera_and_gps_come_back_from_the_file(tmp_path):
    p = save_photo(tmp_path / "a.jpg", taken="2021:05:06 07:08:09", offset="+02:00", datetime_="2022:01:01 00:00:00",
                   make="Canon", model="Canon EOS 5D", gps=(48.8584, -2.2945))
    m = _meta(p)
    assert m["taken"] == "2021-05-06T07:08:09+02:00"  # DateTimeOriginal before DateTime, with its offset
    assert m["camera"] == "Canon EOS 5D"  # the make is not repeated when the model starts with it
    assert m["gps"] == pytest.approx([48.8584, -2.2945], abs=1e-6)  # W is negative
    assert m["size"] == [40, 30] and "notes" not in m


def test_datetime_is_the_fallback_and_southern_eastern_gps_and_a_plain_make(tmp_path):
    m = _meta(save_photo(tmp_path / "b.jpg", datetime_="2019:12:31 23:59:58", make="Apple", model="iPhone 12",
                         gps=(-33.8568, 151.2153)))
    assert m["taken"] == "2019-12-31T23:59:58" and m["camera"] == "Apple iPhone 12"
    assert m["gps"] == pytest.approx([-33.8568, 151.2153], abs=1e-6)


@pytest.mark.parametrize("orientation, size", [(1, [40, 30]), (3, [40, 30]), (5, [30, 40]), (6, [30, 40]),
                                               (8, [30, 40])])
def test_the_size_is_as_displayed(tmp_path, orientation, size):
    assert _meta(save_photo(tmp_path / "o.jpg", orientation=orientation))["size"] == size


def test_a_photo_without_exif_has_only_its_size(tmp_path):
    p = tmp_path / "plain.png"
    Image.new("RGB", (7, 5)).save(p)
    assert _meta(p) == {"size": [7, 5]}


@pytest.mark.parametrize("kw, field, note", [
    ({"taken": ""}, "taken", "DateTimeOriginal: empty"),
    ({"taken": "9999:99:99 99:99:99"}, "taken", "not a possible date"),
    ({"taken": "0000:00:00 00:00:00"}, "taken", "not a possible date"),
    ({"taken": "yesterday"}, "taken", "is not a date"),
    ({"raw_gps": {1: "N", 2: (IFDRational(1, 0), IFDRational(2, 0), IFDRational(3, 0)), 3: "E",
                  4: (IFDRational(1, 1), IFDRational(0, 1), IFDRational(0, 1))}}, "gps", "zero denominator"),
    ({"raw_gps": {1: "Q", 2: (IFDRational(1, 1),), 3: "E", 4: (IFDRational(1, 1),)}}, "gps", "not N/S/E/W"),
])
def test_broken_exif_in_a_file_leaves_the_field_empty_with_a_note(tmp_path, kw, field, note):
    m = _meta(save_photo(tmp_path / "bad.jpg", make="Nikon", **kw))
    assert field not in m and any(note in n for n in m["notes"]), m
    assert m["camera"] == "Nikon" and m["size"] == [40, 30]  # the rest is read


def test_a_broken_date_original_falls_back_to_datetime(tmp_path):
    m = _meta(save_photo(tmp_path / "c.jpg", taken="  ", datetime_="2020:02:29 12:00:00", offset="nonsense"))
    assert m["taken"] == "2020-02-29T12:00:00" and m["notes"] == ["DateTimeOriginal: empty"]


def test_wrong_types_never_raise():
    exif = {271: 12, 272: b"\xffModel\x00", 274: "six", 306: 1234,
            0x8769: {36867: ["2020"], 36881: 5}, 0x8825: {1: 7, 2: "abc", 3: None, 4: object()}}
    m = meta_from_exif(exif, (10, 20))
    assert set(m) == {"camera", "size", "notes"} and m["size"] == [10, 20]
    assert m["camera"] == "\xffModel"  # bytes that are not UTF-8 are read as Latin-1
    assert any("DateTimeOriginal: not text" in n for n in m["notes"])
    assert any("Make: not text" in n for n in m["notes"]) and any("GPSLatitude" in n for n in m["notes"])
    assert meta_from_exif({0x8825: "junk", 0x8769: 3}, ("a", 1)) == {}


@pytest.mark.parametrize("orientation", [0, 9, 255, 65535])
def test_an_orientation_outside_1_to_8_is_read_upright_with_a_note(tmp_path, orientation):
    from vlmatch.features.photo import file_orientation

    p = save_photo(tmp_path / "o.jpg", make="Nikon", orientation=orientation)
    m = _meta(p)
    assert m["size"] == [40, 30] and m["camera"] == "Nikon"  # as stored
    assert m["notes"] == [f"Orientation: '{orientation}' is not 1..8; the photo is read upright, as stored"]
    assert file_orientation(p) == 1
