"""The service on phone photos: thumbnails, files and heat-map overlays upright for an EXIF-rotated photo,
HEIC / TIFF files shown as JPEG, HEIC uploads taken."""

from __future__ import annotations

import io

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image

from vlmatch.search.service import Limits, create_app

from ...features.test_photo import heic_bytes, jpeg_bytes, mad, stored_as, upright_photo
from ..fake import FakeBackend


def client_with(tmp_path, files: dict[int, bytes]):
    images = tmp_path / "images"
    images.mkdir()
    backend = FakeBackend(images)
    for i, data in files.items():
        backend.paths[i].write_bytes(data)
    return backend, TestClient(create_app(backend, Limits(max_upload_bytes=2_000_000, max_upload_pixels=4_000_000,
                                                          thumb_size=64)))


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        assert im.getexif().get(0x0112, 1) == 1  # nothing left for a browser to turn
        return np.asarray(im.convert("RGB"))


def test_thumbnails_of_rotated_and_heic_photos_are_upright(tmp_path):
    up = upright_photo(96, 64)
    want = np.asarray(up.copy().resize((64, 43)))  # the upright photo, thumbnail-sized
    files = {0: jpeg_bytes(stored_as(up, 6), 6), 2: jpeg_bytes(stored_as(up, 3), 3), 3: heic_bytes(stored_as(up, 8), 8)}
    _, c = client_with(tmp_path, files)
    with c:
        for i in files:
            r = c.get(f"/thumbs/{i}")
            assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
            got = decoded(r.content)
            assert got.shape[:2] == (43, 64), i  # landscape, as displayed
            assert mad(got, want) < 6.0, i


def test_heic_and_tiff_files_are_served_as_upright_jpeg(tmp_path):
    up = upright_photo(96, 64)
    buf = io.BytesIO()
    up.save(buf, "TIFF")
    _, c = client_with(tmp_path, {0: heic_bytes(stored_as(up, 6), 6), 2: buf.getvalue(), 3: jpeg_bytes(up, 6)})
    with c:
        for i in (0, 2):
            r = c.get(f"/images/{i}")
            assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
            assert mad(decoded(r.content), np.asarray(up)) < 4.0
            assert c.get(f"/images/{i}", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
        r = c.get("/images/3")  # a JPEG goes out as it is: the browser applies its orientation tag
        assert r.headers["content-type"] == "image/jpeg" and r.content == jpeg_bytes(up, 6)


def test_heic_uploads_are_taken_and_other_types_named(tmp_path):
    backend, c = client_with(tmp_path, {})
    with c:
        r = c.post("/search/image", files={"image": ("phone.heic", heic_bytes(Image.new("RGB", (40, 30), (30, 60, 220))),
                                                    "image/heic")})
        assert r.status_code == 200 and r.json()["results"][0]["text"] == "a blue square"
        r = c.post("/search/image", files={"image": ("clip.mp4", b"\x00\x00\x00\x18ftypisom" + b"\x00" * 40,
                                                    "video/mp4")})
        assert r.status_code == 415 and "HEIC/HEIF" in r.json()["detail"]


def test_a_heat_map_is_drawn_on_the_photo_as_displayed(tmp_path):
    from vlmatch.viz.attention import PairAttention
    from vlmatch.viz.heatmap import render

    up = upright_photo(96, 64)
    (tmp_path / "up.jpg").write_bytes(jpeg_bytes(up, quality=100))
    (tmp_path / "o6.jpg").write_bytes(jpeg_bytes(stored_as(up, 6), 6, quality=100))
    weights = np.zeros((4, 1), dtype=np.float32)
    weights[0, 0] = 1.0  # the top-left cell of a 2 x 2 grid: the red block of the upright photo
    att = PairAttention(words=["red"], weights=weights, score=1.0, method="attention", axis="regions", grid=2)
    pngs = [np.asarray(Image.open(io.BytesIO(render(att, tmp_path / n))).convert("RGB")).astype(int)
            for n in ("up.jpg", "o6.jpg")]
    assert pngs[0].shape == pngs[1].shape
    assert np.abs(pngs[0] - pngs[1]).mean() < 1.0


def test_photos_past_the_upload_cap_get_thumbnails_and_views_decoded_once(tmp_path, monkeypatch):
    """The upload cap (here 4 M pixels) is not the indexed photos' limit: a PNG / TIFF / HEIC larger than it
    (a 48 MP phone photo, scaled down here to 5 M) has a thumbnail and a full view, each decoded once; a RAW
    is shown through its JPEG preview."""
    from vlmatch.search.service import photos as photo_routes

    from ...features.raw_files import jpeg_bytes as preview
    from ...features.raw_files import tiff_raw

    big = Image.new("RGB", (2600, 2000), (30, 140, 60))
    png, tif = io.BytesIO(), io.BytesIO()
    big.save(png, "PNG")
    big.save(tif, "TIFF")
    backend, c = client_with(tmp_path, {0: png.getvalue(), 2: tif.getvalue()})
    raw = backend.paths[3].with_suffix(".nef")
    raw.write_bytes(tiff_raw(preview((120, 80))))
    backend.paths[3] = raw
    calls = []
    real = photo_routes.as_jpeg
    monkeypatch.setattr(photo_routes, "as_jpeg", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    with c:
        for i in (0, 2):
            assert c.get(f"/thumbs/{i}").status_code == 200
        for _ in range(2):
            r = c.get("/images/2")
            assert r.status_code == 200 and decoded(r.content).shape == (2000, 2600, 3)
        assert calls == [backend.paths[2]]  # the second view came from memory
        r = c.get("/images/3")
        assert r.status_code == 200 and decoded(r.content).shape == (80, 120, 3)
        assert c.get("/thumbs/3").status_code == 200
