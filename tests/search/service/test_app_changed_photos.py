"""A photo changed after indexing, as a user meets it: ``vlmatch serve`` in its own process and ``vlmatch explain
--index --id`` in another, over real files. A FIFO in a photo's place is refused by its stat, never opened (every
request for it hung, holding a thread, until the pool was exhausted for every client); another JPEG or a
20,000 x 20,000 PNG in its place is 409 ``photo_changed`` on every file route alike (it answered with the new
photo's heat map while search ranked the old encoding); a photo only touched is still served."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

import vlmatch

from ..photo_index import build_photo_index, draw_photos
from ..serving import free_port, wait_until_serving

ROUTES = ("/images/{id}", "/thumbs/{id}", "/explain/{id}", "/explain/{id}.png")
TEXT = {"text": "a dog on the grass"}
FIFO, JPEG, HUGE, TOUCHED, KEPT = 0, 1, 2, 3, 4


def env() -> dict:
    src = str(Path(vlmatch.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, *sys.path])}


@pytest.fixture(scope="module")
def changed(tmp_path_factory):
    """An index of 5 photos whose files then change: FIFO, JPEG, HUGE replaced, TOUCHED touched, KEPT as is."""
    root = tmp_path_factory.mktemp("changed_photos")
    index = build_photo_index(root, n=5)
    idx = vlmatch.Index.open(index)
    path = {i: Path(idx.path_of(i)) for i in range(5)}
    path[FIFO].unlink()
    os.mkfifo(path[FIFO])
    other = draw_photos(root / "others", 3, seed=7)
    os.replace(other / "photo_002.jpg", path[JPEG])
    Image.new("1", (20_000, 20_000)).save(path[HUGE], "PNG")
    later = path[TOUCHED].stat().st_mtime_ns + 5 * 10**9
    os.utime(path[TOUCHED], ns=(later, later))
    return index, path


@pytest.fixture(scope="module")
def server(changed):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vlmatch.cli", "serve", str(changed[0]), "--port", str(port),
                             "--log-level", "warning", "--workers", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env())
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base, 90, proc.stdout.read)
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(10)


def get(client, route, id):  # noqa: A002
    return client.get(route.format(id=id), params=TEXT if route.startswith("/explain") else None)


@pytest.mark.parametrize("id, says", [(FIFO, "is a FIFO (named pipe) now"), (JPEG, "changed since indexing"),
                                      (HUGE, "changed since indexing")])
def test_a_changed_photo_is_409_on_every_file_route(server, id, says):  # noqa: A002
    for route in ROUTES:
        r = get(server, route, id)
        assert r.status_code == 409, (route, r.text)
        body = r.json()
        assert body["error"] == "photo_changed" and says in body["detail"], (route, body)
        assert f"id {id}" in body["detail"] and "index update" in body["detail"] and "/" not in body["detail"]


def test_captions_of_a_changed_photo_by_id_are_409_too(server):
    for id in (FIFO, JPEG):  # noqa: A001
        r = server.post("/search/image", data={"id": str(id), "k": "3"})
        assert (r.status_code, r.json()["error"]) == (409, "photo_changed"), r.text
    assert server.post("/search/image", data={"id": str(KEPT), "k": "3"}).status_code == 200


@pytest.mark.slow  # seconds of requests held on a FIFO
def test_requests_for_a_fifo_never_exhaust_the_pool(server):
    t0 = time.monotonic()
    for i in range(45):  # the pool held 40 threads: 40 hung requests stopped the service for every client
        assert get(server, ROUTES[i % len(ROUTES)], FIFO).status_code == 409
    for route in ROUTES:
        assert get(server, route, KEPT).status_code == 200, route
    assert time.monotonic() - t0 < 60


@pytest.mark.slow  # seconds
def test_a_photo_only_touched_is_served(server):
    for route in ROUTES:
        assert get(server, route, TOUCHED).status_code == 200, route


@pytest.mark.slow  # the shipped explainer's maps, seconds per case
@pytest.mark.parametrize("id, says", [(FIFO, "is a FIFO (named pipe) now, not the photo indexed"),
                                      (JPEG, "changed since indexing")])
def test_explain_of_an_indexed_id_says_it_changed_in_one_line(changed, tmp_path, id, says):  # noqa: A002
    index, path = changed
    out = tmp_path / "map.png"
    r = subprocess.run([sys.executable, "-m", "vlmatch.cli", "explain", "--index", str(index), "--id", str(id),
                        "--text", TEXT["text"], "--out", str(out)], capture_output=True, text=True, timeout=120,
                       env=env())
    assert r.returncode != 0 and not out.exists()
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and says in err and str(path[id]) in err and "Traceback" not in err
