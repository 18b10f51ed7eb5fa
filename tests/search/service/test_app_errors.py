"""The HTTP service under hostile or broken input: what a client gets wrong is a 4xx in our own words,
a failure of the server is a 500 that says nothing internal, bodies are capped before they are read,
and uploads are decoded only on the model workers once a request is admitted.

Everything runs in-process (TestClient / httpx's ASGI transport) with small configured limits."""

import asyncio
import io
import logging
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from vlmatch.cli import main
from vlmatch.errors import ConfigError, DataError
from vlmatch.search.service import Limits, create_app
from vlmatch.search.service import search as search_routes
from vlmatch.search.service.errors import INTERNAL

from ..fake import FakeBackend
from .test_app import assert_error, jpeg

LIMITS = dict(max_text_chars=50, max_k=20, max_candidates=50, max_upload_bytes=20_000, max_upload_pixels=1_000_000,
              max_decode_pixels=1_000_000, max_body_bytes=2_000)
LEAKS = ("Error", "Traceback", "pydantic", "surrogates not allowed", "shape", "/")  # texts of exceptions and paths


@pytest.fixture
def backend(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    return FakeBackend(images)


def client_of(backend, **limits):
    return TestClient(create_app(backend, Limits(**{**LIMITS, **limits})), raise_server_exceptions=False)


@pytest.fixture
def client(backend):
    with client_of(backend) as c:
        yield c


def post_json(client, raw: bytes, path="/search"):
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def assert_says_nothing_internal(r, status=500):
    body = assert_error(r, status, "internal_error" if status == 500 else None)
    for leak in LEAKS:
        assert leak not in body["detail"], body
    return body


# --- text a client sends ------------------------------------------------------------------------

def test_a_lone_surrogate_in_the_query_is_a_400(client):
    r = post_json(client, b'{"text": "dog \\ud800 x"}')
    body = assert_error(r, 400, "bad_text")
    assert "lone surrogate" in body["detail"] and "\\ud800" in body["detail"] and "Pydantic" not in r.text
    assert client.post("/search", json={"text": "a red square"}).status_code == 200  # and it still serves


@pytest.mark.parametrize("text", ["\u200b\u200c\u200d\ufeff", "\u00a0\u00a0", " \u2060\u200b "])
def test_text_of_invisible_characters_only_is_empty_like_spaces(client, text):
    assert_error(client.post("/search", json={"text": text}), 400, "empty_text")
    assert_error(client.get("/search", params={"q": text}), 400, "empty_text")
    assert_error(client.get("/explain/1", params={"text": text}), 400, "empty_text")
    assert client.post("/search", json={"text": "\u200ba red square"}).status_code == 200  # words around them count


@pytest.mark.parametrize("route", ["/search?q=", "/explain/1?text=", "/explain/1.png?text=", "/search?k=3&q=a+"])
@pytest.mark.parametrize("raw,byte", [("%FF%FE", "\\xff"), ("%ED%A0%80", "\\xed"), ("red%C3", "\\xc3")])
def test_query_bytes_that_are_not_utf8_are_bad_text_on_every_route(client, backend, route, raw, byte):
    body = assert_error(client.get(route + raw), 400, "bad_text")
    assert "is not UTF-8 text (byte " + byte in body["detail"], body
    assert backend.asked_ids == []  # refused before any lookup or model work


@pytest.mark.parametrize("raw,says", [(b'{"text": "\xff\xfe"}', "the JSON body is not UTF-8 text"),
                                      (b'{"text": "\xed\xa0\x80 dog"}', "lone surrogate (\\ud800)")])
def test_a_json_body_that_is_not_utf8_is_bad_text_too(client, raw, says):
    body = assert_error(post_json(client, raw), 400, "bad_text")  # as the same bytes in a query string
    assert says in body["detail"]


@pytest.mark.parametrize("field,value", [("k", True), ("like", True), ("candidates", False), ("k", "5"),
                                         ("k", 5.0), ("text_weight", True), ("min_score", False), ("text", 3)])
def test_json_fields_keep_their_types(client, field, value):
    """``k: true`` was read as 1 and ``like: true`` as id 1: a JSON value of another type is refused, naming it."""
    body = assert_error(client.post("/search", json={"text": "a dog", field: value}), 422, "invalid_request")
    assert body["detail"].startswith(f"{field}: ") and "\n" not in body["detail"]


@pytest.mark.parametrize("sent", ["text/plain", "application/xml", "application/x-www-form-urlencoded",
                                  "text/plain; charset=utf-8"])
def test_a_json_body_sent_as_another_type_is_a_415_naming_it(client, sent):
    r = client.post("/search", content=b'{"text": "a dog", "k": 3}', headers={"content-type": sent})
    body = assert_error(r, 415, "unsupported_media_type")
    assert f"sent as {sent.split(';')[0]}" in body["detail"] and "application/json" in body["detail"]
    assert "dictionary" not in body["detail"]


def test_the_same_body_as_json_is_served_and_without_a_type_is_a_415(client):
    for sent in ("application/json", "application/vnd.api+json"):
        r = client.post("/search", content=b'{"text": "a dog", "k": 3}', headers={"content-type": sent})
        assert r.status_code == 200, (sent, r.text)
    r = client.post("/search", content=b'{"text": "a dog", "k": 3}')
    assert "sent without a content type" in assert_error(r, 415, "unsupported_media_type")["detail"]


@pytest.mark.parametrize("method,path,allow", [("HEAD", "/", "GET"), ("PUT", "/search", "GET, POST"),
                                               ("HEAD", "/search", "GET, POST"), ("DELETE", "/health", "GET"),
                                               ("POST", "/images/1", "GET"), ("PATCH", "/explain/1.png", "GET")])
def test_every_405_names_the_methods_allowed(client, method, path, allow):
    r = client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow
    if method != "HEAD":
        assert r.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("raw", [b'{"text": "red", "min_score": NaN}', b'{"text": "red", "min_score": Infinity}',
                                 b'{"text": "red", "min_score": -Infinity}'])
def test_min_score_must_be_finite(client, raw):
    assert "finite" in assert_error(post_json(client, raw), 400, "bad_min_score")["detail"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_min_score_must_be_finite_in_links(client, value):
    assert_error(client.get("/search", params={"q": "red", "min_score": value}), 400, "bad_min_score")


def test_deeply_nested_json_is_a_clean_4xx(backend):
    with client_of(backend, max_body_bytes=10_000) as c:
        r = post_json(c, b"[" * 4_000 + b"]" * 4_000)  # under the body cap, deeper than json's recursion limit
    assert 400 <= r.status_code < 500 and set(r.json()) == {"error", "detail"}


# --- what the index gives back -----------------------------------------------------------------

def test_file_names_that_are_not_utf8_come_back_escaped(client, backend):
    # os.fsdecode(b"caf\xe9.jpg"): how Python names a file whose name is not UTF-8
    backend.paths[0] = backend.paths[0].with_name("caf\udce9\nx.jpg")
    r = client.post("/search", json={"text": "a red square", "k": 3})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["path"].endswith("caf\\xe9\nx.jpg")


def test_caption_texts_are_escaped_too(client, backend):
    backend.captions[0] = "a red square \udcff"
    r = client.post("/search/image", data={"id": "0", "k": "1"})
    assert r.status_code == 200 and r.json()["results"][0]["text"] == "a red square \\xff"


def test_internal_errors_say_nothing_internal(client, backend, caplog):
    def broken(*args):
        raise RuntimeError("shape '[1, 49, 32]' is invalid for input of size 1234 at /srv/index/images/enc")

    backend.search = broken
    backend.explain = broken
    with caplog.at_level(logging.ERROR, logger="vlmatch.search"):
        body = assert_says_nothing_internal(client.post("/search", json={"text": "a red square"}))
        assert body["detail"] == INTERNAL
        assert_says_nothing_internal(client.get("/explain/1", params={"text": "red"}))
    assert "shape '[1, 49, 32]'" in caplog.text  # the server's log has it all


def test_a_damaged_index_file_is_a_500_not_the_clients_fault(client, backend):
    def damaged(*args):
        raise DataError("/srv/index/images/enc/regions.npy", "unreadable encoding array (mmap length is greater)")

    backend.search = damaged
    assert_says_nothing_internal(client.post("/search", json={"text": "a red square"}))


def test_our_own_errors_name_the_index_not_its_folder(backend):
    backend.root = backend.dir  # IndexBackend has the index folder here

    def refuse(*args):
        raise ConfigError(f"{backend.dir}: no image grid is known (built from features without a backbone)")

    backend.explain_png = refuse
    with client_of(backend) as c:
        body = assert_error(c.get("/explain/1.png", params={"text": "red"}), 400, "bad_request")
    assert body["detail"] == "the index: no image grid is known (built from features without a backbone)"


def test_a_response_that_cannot_be_serialised_is_a_clean_500(client, backend):
    backend.search = lambda *a: [{"id": 0, "path": "x.jpg"}]  # no score: the response model refuses it
    assert_says_nothing_internal(client.post("/search", json={"text": "a red square"}))


def test_explain_png_of_a_deleted_file_is_404(client, backend):
    backend.paths[2].unlink()
    assert_error(client.get("/explain/2.png", params={"text": "blue"}), 404, "file_missing")


def test_explain_of_a_file_too_large_to_decode_answers_as_thumbs_does(backend, monkeypatch):
    """It said 415 'cannot be decoded' where /thumbs said image_too_large."""
    from vlmatch.features.photo import PhotoTooLarge

    def too_large(image_id, text, method=None):
        raise PhotoTooLarge(backend.paths[image_id], "has 20000x20000 pixels; the limit is 256000000 pixels")

    monkeypatch.setattr(backend, "explain", too_large)
    monkeypatch.setattr(backend, "explain_png", too_large)
    with client_of(backend) as c:
        for route in ("/explain/1", "/explain/1.png"):
            body = assert_error(c.get(route, params={"text": "a dog"}), 415, "image_too_large")
            assert "has 20000x20000 pixels" in body["detail"] and "/" not in body["detail"]


def test_thumbnails_of_broken_or_huge_indexed_files(backend, tmp_path):
    backend.paths[0].write_bytes(jpeg()[:300])  # truncated
    Image.new("RGB", (1200, 1000)).save(backend.paths[1], "PNG")  # 1.2 Mpixel PNG: no reduced decode exists
    Image.new("RGB", (4000, 3000), (200, 10, 10)).save(backend.paths[2], "JPEG")  # JPEG: decoded at 1/8 scale
    with client_of(backend) as c:
        body = assert_error(c.get("/thumbs/0"), 415, "bad_image")
        assert "PIL" not in body["detail"] and "truncated" not in body["detail"]
        assert_error(c.get("/thumbs/1"), 415, "image_too_large")
        r = c.get("/thumbs/2")
        assert r.status_code == 200 and max(Image.open(io.BytesIO(r.content)).size) == 256


# --- limits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [dict(max_upload_bytes=0), dict(max_upload_bytes=-1), dict(workers=0), dict(queue=-1),
                                 dict(max_body_bytes=0), dict(max_upload_pixels=float("nan")), dict(max_k=2.5)])
def test_limits_are_checked(bad):
    with pytest.raises(ConfigError, match="service limit"):
        Limits(**bad)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "many"])
def test_serve_refuses_absurd_upload_caps(value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "some_index", "--max-upload-mb", value])
    assert e.value.code == 2 and "--max-upload-mb" in capsys.readouterr().err


def test_json_bodies_are_capped_before_they_are_read(client):
    r = client.post("/search", json={"text": "red", "pad": "x" * 3_000})
    body = assert_error(r, 413, "body_too_large")
    assert "2000 bytes" in body["detail"]
    assert client.post("/search", json={"text": "red", "pad": "x" * 1_000}).status_code == 200


def test_a_body_without_a_length_is_cut_off_at_the_cap(backend):
    app = create_app(backend, Limits(**LIMITS))
    pulled = []

    async def chunks():
        yield b'{"text": "red", "pad": "'
        for i in range(1_000):  # 1 MB in all, if it were all read
            pulled.append(i)
            yield b"x" * 1_000

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/search", content=chunks(), headers={"content-type": "application/json"})

    r = asyncio.run(scenario())
    assert_error(r, 413, "body_too_large")
    assert len(pulled) <= 3  # stopped at the 2000-byte cap, not after a megabyte


def test_an_upload_has_its_own_cap(client):
    small = jpeg()
    assert len(small) < 2_000
    assert client.post("/search/image", files={"image": ("s.jpg", small, "image/jpeg")}).status_code == 200
    big = jpeg(size=(400, 300)) + b"\0" * 25_000  # over max_upload_bytes + the form's allowance
    assert_error(client.post("/search/image", files={"image": ("b.jpg", big, "image/jpeg")}), 413, "body_too_large")
    mid = jpeg(size=(400, 300)) + b"\0" * 3_000  # over the JSON cap, within the upload cap: accepted
    assert 2_000 < len(mid) < 20_000
    assert client.post("/search/image", files={"image": ("m.jpg", mid, "image/jpeg")}).status_code == 200


def test_uploads_are_refused_when_busy_before_any_decoding(backend, monkeypatch):
    decoded = []
    real_check = search_routes.check_upload

    def counting_check(data, limits):
        decoded.append(threading.current_thread().name)
        return real_check(data, limits)

    monkeypatch.setattr(search_routes, "check_upload", counting_check)
    app = create_app(backend, Limits(**{**LIMITS, "workers": 1, "queue": 0}))
    backend.gate = threading.Event()

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            held = asyncio.create_task(c.get("/search", params={"q": "red"}))
            while app.state.pool.in_flight < 1:
                await asyncio.sleep(0.01)
            refused = [await c.post("/search/image", files={"image": ("x.jpg", jpeg(), "image/jpeg")})
                       for _ in range(5)]
            assert decoded == []  # refused before a single decode
            backend.gate.set()
            await held
            ok = await c.post("/search/image", files={"image": ("x.jpg", jpeg(), "image/jpeg")})
            return refused, ok

    refused, ok = asyncio.run(scenario())
    for r in refused:
        assert_error(r, 503, "busy")
    assert ok.status_code == 200
    assert decoded == ["vlmatch-model_0"]  # the one decode ran on the model worker
