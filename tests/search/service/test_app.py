"""The HTTP API in-process (FastAPI's TestClient) over a fake backend: every endpoint and limit."""

import asyncio
import io
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vlmatch import __version__
from vlmatch.search.service import Limits, create_app

from ..fake import FakeBackend

SECRET = "TOP-SECRET-CONTENT"


@pytest.fixture
def backend(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "secret.txt").write_text(SECRET)  # beside the images: traversal must never reach it
    return FakeBackend(images)


@pytest.fixture
def client(backend):
    with TestClient(create_app(backend, Limits(max_text_chars=50, max_k=20, max_candidates=50,
                                               max_upload_bytes=20_000, max_upload_pixels=1_000_000))) as c:
        yield c


def jpeg(colour=(220, 30, 30), size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG")
    return buf.getvalue()


def assert_error(r, status, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error", "detail"} and body["detail"]
    if code:
        assert body["error"] == code
    return body


def test_health(client):
    h = client.get("/health").json()
    assert h == {"status": "ok", "model": "fake", "index_size": 8, "captions": 8, "index_version": None,
                 "version": __version__, "workers": 2, "queue": 16, "in_flight": 0}


def test_search_post_and_get_rank_by_score(client):
    r = client.post("/search", json={"text": "a blue square", "k": 3, "candidates": 10})
    assert r.status_code == 200
    body = r.json()
    assert [x["id"] for x in body["results"]] == [2, 6, 0]  # the blue images first, then by id
    assert set(body["results"][0]) == {"id", "path", "score", "stage1_score", "taken", "camera", "gps", "size",
                                       "relevance", "no_match"}
    assert body["results"][0]["relevance"] is None and body["no_match"] is None  # this index has no relevance scale
    assert body["results"][0]["taken"] is None  # the fake's photos record no EXIF: null, the field is still there
    assert body["results"][0]["path"].endswith("img002.jpeg")
    scores = [x["score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert set(body["timings"]) == {"queue_ms", "search_ms", "total_ms"}
    g = client.get("/search", params={"q": "a blue square", "k": 3, "candidates": 10}).json()
    assert g["results"] == body["results"]
    assert client.get("/search", params={"q": "blue"}).json()["k"] == 10  # defaults


def test_search_min_score_filters(client):
    body = client.post("/search", json={"text": "blue", "k": 8, "min_score": 0.3}).json()
    assert [x["id"] for x in body["results"]] == [2, 6]


@pytest.mark.parametrize("payload,code", [
    ({"text": "x" * 51}, "text_too_long"),
    ({"text": "   "}, "empty_text"),
    ({"text": "dog", "k": 0}, "bad_k"),
    ({"text": "dog", "k": 21}, "bad_k"),
    ({"text": "dog", "k": 10, "candidates": 5}, "bad_candidates"),
    ({"text": "dog", "k": 10, "candidates": 51}, "bad_candidates"),
])
def test_search_limits(client, payload, code):
    assert_error(client.post("/search", json=payload), 400, code)
    params = {"q": payload["text"], **{k: v for k, v in payload.items() if k != "text"}}
    assert_error(client.get("/search", params=params), 400, code)


def test_malformed_requests_are_json_errors(client):
    assert "k:" in assert_error(client.post("/search", json={"text": "dog", "k": "many"}), 422, "invalid_request")["detail"]
    assert_error(client.post("/search", content=b"{not json", headers={"content-type": "application/json"}), 422)
    assert_error(client.get("/search"), 422, "invalid_request")  # no q
    assert_error(client.get("/nowhere"), 404, "not_found")
    assert_error(client.delete("/search"), 405)


def test_images_by_id_with_type_and_cache_headers(client, backend):
    r = client.get("/images/0")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert r.content == backend.paths[0].read_bytes()
    assert "max-age" in r.headers["cache-control"] and r.headers["etag"]
    again = client.get("/images/0", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and not again.content
    assert client.get("/images/1").headers["content-type"] == "image/png"
    assert_error(client.get("/images/8"), 404, "unknown_id")
    assert_error(client.get("/images/-1"), 404, "unknown_id")


def test_images_of_deleted_files_are_404(client, backend):
    backend.paths[3].unlink()
    assert_error(client.get("/images/3"), 404, "file_missing")
    assert_error(client.get("/thumbs/3"), 404, "file_missing")


def test_thumbs(client):
    r = client.get("/thumbs/1")  # the PNG comes back as a JPEG thumbnail
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert max(Image.open(io.BytesIO(r.content)).size) <= 256
    assert "max-age" in r.headers["cache-control"]
    assert client.get("/thumbs/1", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    assert_error(client.get("/thumbs/99"), 404, "unknown_id")


TRAVERSALS = [
    "../secret.txt", "../../secret.txt", "..%2fsecret.txt", "%2e%2e%2fsecret.txt", "%2e%2e/%2e%2e/secret.txt",
    "..%252fsecret.txt", "0%2f..%2f..%2fsecret.txt", "0/../../secret.txt", "%2Fetc%2Fpasswd", "/etc/passwd",
    "%252Fetc%252Fpasswd", "0%00.txt", "..\\secret.txt", "C:%5Cwindows%5Cwin.ini", "img000.jpeg",
]


@pytest.mark.parametrize("route", ["images", "thumbs", "explain"])
@pytest.mark.parametrize("attempt", TRAVERSALS)
def test_path_traversal_never_reaches_a_file(client, backend, route, attempt, tmp_path):
    (tmp_path / "images" / "secret.txt").write_text(SECRET)
    r = client.get(f"/{route}/{attempt}", params={"text": "dog"} if route == "explain" else None)
    assert r.status_code in (404, 405, 422), (attempt, r.status_code)
    assert SECRET not in r.text and "root:" not in r.text
    assert r.headers["content-type"].startswith("application/json")
    assert all(isinstance(i, int) for i in backend.asked_ids)


def test_explain_json_and_png(client):
    r = client.get("/explain/2", params={"text": "a blue square"})
    assert r.status_code == 200
    ex = r.json()
    assert ex["words"] == ["<start>", "a", "blue", "square", "<end>"]
    assert len(ex["weights"]) == 5 and all(len(w) == 4 for w in ex["weights"])
    assert ex["grid"] == [2, 2] and ex["axis"] == "regions" and ex["id"] == 2
    assert ex["content"] == [False, False, True, True, False]  # the page opens on "blue", not "a"
    assert ex["vmax"] == pytest.approx(max(max(w) for w in ex["weights"][1:4]))  # scale over the shown words
    p = client.get("/explain/2.png", params={"text": "a blue square"})
    assert p.status_code == 200 and p.headers["content-type"] == "image/png"
    assert p.content.startswith(b"\x89PNG")
    assert_error(client.get("/explain/42", params={"text": "dog"}), 404, "unknown_id")
    assert_error(client.get("/explain/42.png", params={"text": "dog"}), 404, "unknown_id")
    assert_error(client.get("/explain/2", params={"text": "y" * 51}), 400, "text_too_long")
    assert_error(client.get("/explain/2.png"), 422)


def test_search_by_uploaded_image_and_by_id(client):
    r = client.post("/search/image", files={"image": ("x.jpg", jpeg((30, 60, 220)), "image/jpeg")}, data={"k": "2"})
    assert r.status_code == 200, r.text
    assert [x["text"] for x in r.json()["results"]] == ["a blue square"] * 2
    r = client.post("/search/image", data={"id": "3", "k": "1"})
    assert r.json()["results"][0]["text"] == "a yellow square"
    assert_error(client.post("/search/image", data={"id": "99"}), 404, "unknown_id")
    assert_error(client.post("/search/image", data={"k": "1"}), 400, "bad_request")  # neither
    assert_error(client.post("/search/image", files={"image": ("x.jpg", jpeg(), "image/jpeg")}, data={"id": "1"}), 400)
    assert_error(client.post("/search/image", data={"id": "1", "k": "21"}), 400, "bad_k")


def test_uploads_are_size_and_content_checked(client):
    big = jpeg(size=(2000, 1500))
    big += b"\0" * max(0, 20_001 - len(big))
    assert_error(client.post("/search/image", files={"image": ("big.jpg", big, "image/jpeg")}), 413, "upload_too_large")
    fake = b"#!/bin/sh\necho this is not a jpeg\n"
    assert_error(client.post("/search/image", files={"image": ("fake.jpg", fake, "image/jpeg")}), 415, "not_an_image")
    truncated = jpeg()[:200]  # right magic bytes, broken body
    assert_error(client.post("/search/image", files={"image": ("t.jpg", truncated, "image/jpeg")}), 415, "bad_image")
    noisy = io.BytesIO()
    Image.effect_noise((200, 200), 64).convert("RGB").save(noisy, "JPEG")
    half = noisy.getvalue()[: len(noisy.getvalue()) // 2]  # the header is intact, the pixels end half-way
    assert_error(client.post("/search/image", files={"image": ("h.jpg", half, "image/jpeg")}), 415, "bad_image")
    buf = io.BytesIO()
    Image.new("1", (4000, 4000)).save(buf, "PNG")  # 16 Mpixel in a few kB: a decompression bomb for this limit
    assert len(buf.getvalue()) < 20_000
    assert_error(client.post("/search/image", files={"image": ("b.png", buf.getvalue(), "image/png")}), 413, "image_too_large")
    assert_error(client.post("/search/image", files={"image": ("e.jpg", b"", "image/jpeg")}), 400, "empty_upload")


def test_image_search_needs_a_caption_collection(tmp_path):
    with TestClient(create_app(FakeBackend(tmp_path, captions=False))) as c:
        assert_error(c.post("/search/image", data={"id": "1"}), 400, "no_captions")


def test_full_queue_answers_503_then_recovers(backend):
    app = create_app(backend, Limits(workers=1, queue=1))
    backend.gate = threading.Event()

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            held = [asyncio.create_task(c.get("/search", params={"q": f"red {i}"})) for i in range(2)]
            while app.state.pool.in_flight < 2:  # one running, one waiting
                await asyncio.sleep(0.01)
            refused = await c.get("/search", params={"q": "red"})
            refused_explain = await c.get("/explain/0", params={"text": "red"})
            health = await c.get("/health")  # no model work: still answers
            backend.gate.set()
            done = await asyncio.gather(*held)
            after = await c.get("/search", params={"q": "red"})
            return refused, refused_explain, health, done, after

    refused, refused_explain, health, done, after = asyncio.run(scenario())
    assert_error(refused, 503, "busy")
    assert refused.headers["retry-after"] == "1"
    assert_error(refused_explain, 503, "busy")
    assert health.json()["in_flight"] == 2
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200
    assert app.state.pool.in_flight == 0 and app.state.pool.rejected == 2


def test_openapi_schema_documents_every_endpoint(client):
    schema = client.get("/openapi.json").json()
    assert {"/search", "/search/image", "/images/{id}", "/thumbs/{id}", "/explain/{id}", "/explain/{id}.png",
            "/health"} <= set(schema["paths"])
    assert {"get", "post"} <= set(schema["paths"]["/search"])
    assert "stage1_score" in schema["components"]["schemas"]["SearchResult"]["properties"]


def test_page_is_self_contained(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert 'id="q"' in html and 'id="more"' in html and "/explain/" in html
    assert "http://" not in html and "https://" not in html and "//cdn" not in html  # works offline
