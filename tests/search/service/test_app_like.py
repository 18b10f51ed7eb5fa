"""Search by photo over HTTP: ``POST /search`` with ``like`` (JSON) or an uploaded ``image`` (multipart),
``POST /search/like``, ``GET /search?like=ID`` -- over the fake backend, and once over a real index."""

import pytest
from fastapi.testclient import TestClient

from vlmatch.search.service import IndexBackend, Limits, create_app

from ..fake import FakeBackend
from ..like_index import like_index  # noqa: F401 -- the fixture
from .test_app import assert_error, jpeg


@pytest.fixture
def backend(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    return FakeBackend(images)


@pytest.fixture
def client(backend):
    with TestClient(create_app(backend, Limits(max_k=20, max_candidates=50, max_upload_bytes=20_000))) as c:
        yield c


def ids(r) -> list[int]:
    assert r.status_code == 200, r.text
    return [x["id"] for x in r.json()["results"]]


def test_json_like_an_id(client, backend):
    r = client.post("/search", json={"like": 2, "k": 3})  # image 2 is blue, as are 6 (every 4th)
    assert ids(r)[:2] == [2, 6]
    body = r.json()
    assert body["like"] == 2 and body["text"] is None and body["k"] == 3
    assert backend.liked == (2, None, None)


def test_json_like_with_text_and_weight(client, backend):
    r = client.post("/search", json={"like": 1, "text": "at night", "text_weight": 0.25, "k": 2})
    assert ids(r) == [1, 5] and r.json()["text"] == "at night"
    assert backend.liked == (1, "at night", 0.25)


def test_multipart_post_search_takes_an_upload(client):
    r = client.post("/search", files={"image": ("q.jpg", jpeg((240, 220, 40)), "image/jpeg")}, data={"k": "2"})
    assert ids(r) == [3, 7]  # yellow
    assert r.json()["like"] is None


def test_multipart_like_an_id_and_the_sibling_route(client):
    assert ids(client.post("/search", data={"like": "0", "k": "2"}, files={"x": ("", b"")})) == [0, 4]
    assert ids(client.post("/search/like", data={"like": "0", "k": "2"})) == [0, 4]
    up = client.post("/search/like", files={"image": ("q.jpg", jpeg((30, 180, 60)), "image/jpeg")},
                     data={"text": "", "k": "2"})  # an empty text field of a form: no text
    assert ids(up) == [1, 5] and up.json()["text"] is None


def test_get_like_for_links(client):
    assert ids(client.get("/search", params={"like": 3, "k": 2})) == [3, 7]
    assert_error(client.get("/search"), 422, "invalid_request")  # neither q nor like


def test_json_text_search_still_works_and_text_is_required_without_like(client):
    assert ids(client.post("/search", json={"text": "a blue square", "k": 1})) == [2]
    assert_error(client.post("/search", json={"k": 3}), 422, "invalid_request")


@pytest.mark.parametrize("body, status, code", [
    ({"like": 99}, 404, "unknown_id"),
    ({"like": 1, "k": 0}, 400, "bad_k"),
    ({"like": 1, "text_weight": 0.5}, 400, "bad_text_weight"),
    ({"like": 1, "text": "x", "text_weight": 3}, 400, "bad_text_weight"),
    ({"like": 1, "text": "x" * 600}, 400, "text_too_long"),
])
def test_json_like_errors(client, body, status, code):
    assert_error(client.post("/search", json=body), status, code)


def test_multipart_errors(client):
    assert_error(client.post("/search/like", data={"k": "2"}), 400, "bad_request")  # neither
    both = client.post("/search", files={"image": ("q.jpg", jpeg(), "image/jpeg")}, data={"like": "1"})
    assert_error(both, 400, "bad_request")
    assert_error(client.post("/search", files={"image": ("q.txt", b"not an image", "text/plain")}), 415, "not_an_image")
    big = client.post("/search", files={"image": ("q.jpg", b"\xff\xd8\xff" + b"0" * 30_000, "image/jpeg")})
    assert big.status_code == 413


def test_over_a_real_index(like_index):  # noqa: F811
    from pathlib import Path

    backend = IndexBackend.open(like_index)
    first = next(it["id"] for it in backend.index.items if Path(it["path"]).name == "photo_000.jpg")
    with TestClient(create_app(backend)) as c:
        r = c.post("/search", json={"like": first, "k": 3})
        assert r.status_code == 200, r.text
        names = [x["path"] for x in r.json()["results"]]
        assert names[0] == "photo_000.jpg" and set(names[1:]) == {"copy_small.jpg", "copy_q40.jpg"}
        data = Path(backend.path_of(first)).read_bytes()
        up = c.post("/search", files={"image": ("p.jpg", data, "image/jpeg")}, data={"k": "1"})
        assert up.status_code == 200, up.text
        assert [x["path"] for x in up.json()["results"]] == ["photo_000.jpg"]
        # an upload stored sideways with an orientation tag is read upright: its upright original comes first
        rot = next(it["path"] for it in backend.index.items if Path(it["path"]).name == "photo_001_rot.jpg")
        up = c.post("/search", files={"image": ("r.jpg", Path(rot).read_bytes(), "image/jpeg")}, data={"k": "2"})
        assert up.status_code == 200, up.text
        assert {x["path"] for x in up.json()["results"]} == {"photo_001.jpg", "photo_001_rot.jpg"}


def test_a_multipart_post_search_gets_the_upload_cap_not_the_json_cap(backend):
    """The form is routed before the body cap is chosen: an upload above the 64 KB JSON cap passes."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    assert len(data) > Limits().max_body_bytes
    with TestClient(create_app(backend, Limits(max_upload_bytes=2_000_000))) as c:
        r = c.post("/search", files={"image": ("n.jpg", data, "image/jpeg")}, data={"k": "2"})
        assert r.status_code == 200, r.text
        assert_error(c.post("/search", json={"text": "x" * 70_000}), 413, "body_too_large")
