"""`vlmatch serve` follows its index folder: after an `index update` or a rebuild with another model under
a running server, it serves the committed version (and /health names it), requests in flight finish on
the version they started with and none fails, and afterwards its answers equal `vlmatch search`'s."""

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient

import vlmatch
from vlmatch.cli import main
from vlmatch.search.service import IndexBackend, Limits, create_app

from ..test_index_safety import NAMES, build, ckpts  # noqa: F401  (the module fixture)
from ..tiny import jpegs, tiny_backbone  # noqa: F401  (autouse)

Q = "a red dog"


def cli_search(out, tmp_path, n):
    """(id, path inside the photo folder, score) of `vlmatch search --json`, best first."""
    js = tmp_path / "cli.json"
    assert main(["search", str(out), Q, "-k", str(n), "--candidates", str(n), "--json", str(js)]) == 0
    root = vlmatch.Index.open(out).manifest["source"]["root"]
    return [(r["id"], r["path"][len(root) + 1:], round(r["score"], 5)) for r in json.loads(js.read_text())["results"]]


def served_search(client, n):
    r = client.post("/search", json={"text": Q, "k": n, "candidates": n})
    assert r.status_code == 200, r.text
    return [(x["id"], x["path"], round(x["score"], 5)) for x in r.json()["results"]]


class InFlight:
    """A search request held inside the version it started on until ``release``."""

    def __init__(self, client, backend, monkeypatch, n):
        self.entered, self.gate, self.answer = threading.Event(), threading.Event(), None
        index = backend.index
        real = index.search

        def held(*a, **k):
            self.entered.set()
            assert self.gate.wait(60)
            return real(*a, **k)

        monkeypatch.setattr(index, "search", held)  # this version's index only
        self.thread = threading.Thread(target=lambda: setattr(self, "answer", served_search(client, n)))
        self.thread.start()
        assert self.entered.wait(60)

    def release(self):
        self.gate.set()
        self.thread.join(60)
        return self.answer


@pytest.mark.slow  # a server process and rebuilds
def test_an_update_and_a_rebuild_under_a_running_server(ckpts, tmp_path, monkeypatch, capsys):  # noqa: F811
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    backend = IndexBackend.open(out)
    with TestClient(create_app(backend, Limits(workers=2, queue=8)), raise_server_exceptions=False) as client:
        before = served_search(client, 6)
        v0 = client.get("/health").json()["index_version"]
        assert before == cli_search(out, tmp_path, 6) and v0 and backend.reload() is False  # nothing new yet

        # an update (one photo deleted, two added) while a request is in flight
        held = InFlight(client, backend, monkeypatch, 6)
        jpegs(imgs, ["new0.jpg", "new1.jpg"], seed=3)
        (imgs / "im5.jpg").unlink()
        assert main(["index", "update", str(out), "--no-progress"]) == 0
        assert backend.reload() is True
        h = client.get("/health").json()
        assert h["index_size"] == 7 and h["index_version"] not in (None, v0)
        assert served_search(client, 7) == cli_search(out, tmp_path, 7)  # new photos in, the deleted one out
        assert {p for _, p, _ in served_search(client, 7)} == {*NAMES[:5], "new0.jpg", "new1.jpg"}
        assert held.release() == before  # the request in flight finished on its own version
        deleted = next(i for i, p, _ in before if p == "im5.jpg")
        assert client.get(f"/images/{deleted}").json()["error"] == "unknown_id"  # not "update the index"

        # a rebuild with another re-scorer and retriever under it
        held = InFlight(client, backend, monkeypatch, 7)
        v1 = h["index_version"]
        capsys.readouterr()
        assert build(ckpts, imgs, out, model="b", retriever="vsepp_b") == 0
        assert backend.reload() is True
        after = served_search(client, 7)
        assert after == cli_search(out, tmp_path, 7) and after != held.release()
        assert client.get("/health").json()["index_version"] not in (v0, v1)
        for i, p, _ in after:  # an id names the same photo on the server and in the CLI's index
            assert client.get(f"/images/{i}").content == (imgs / p).read_bytes()


def test_the_watcher_serves_a_new_version_within_seconds_while_requests_keep_coming(ckpts, tmp_path):  # noqa: F811
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    backend = IndexBackend.open(out)
    backend.watch(0.05)
    failures, stop = [], threading.Event()
    with TestClient(create_app(backend, Limits(workers=2, queue=32)), raise_server_exceptions=False) as client:
        v0 = client.get("/health").json()["index_version"]

        def hammer():
            while not stop.is_set():
                r = client.post("/search", json={"text": Q, "k": 3})
                if r.status_code != 200:
                    failures.append(r.text)

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            assert build(ckpts, imgs, out, model="b") == 0
            t0 = time.monotonic()
            while client.get("/health").json()["index_version"] == v0 and time.monotonic() - t0 < 30:
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert client.get("/health").json()["index_version"] != v0 and backend.reloads == 1
        assert served_search(client, 6) == cli_search(out, tmp_path, 6)
    assert failures == []


def test_a_version_that_cannot_be_opened_is_logged_and_the_served_one_kept(ckpts, tmp_path, caplog):  # noqa: F811
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    backend = IndexBackend.open(out)
    v0 = backend.version
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "dtype": "float32"}))  # edited: its seal fails
    assert backend.reload() is False and backend.version == v0 and backend.size == 6
    assert "cannot be opened" in caplog.text and "still serving version " + v0 in caplog.text
    assert backend.reload() is False  # not tried again until the manifest changes again


@pytest.mark.parametrize("every,watching", [("0.05", True), ("0", False)])
def test_serve_watches_its_index_unless_told_not_to(ckpts, tmp_path, monkeypatch, capsys, every, watching):  # noqa: F811
    import uvicorn

    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    assert main(["serve", str(out), "--reload-every", every]) == 0
    backend = served[0].state.backend
    assert f"version {backend.version}) at http://127.0.0.1:8000/" in capsys.readouterr().out
    assert (backend.watcher is not None and backend.watcher.is_alive()) == watching
    backend.stop()


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_serve_refuses_a_reload_interval_that_is_no_number_of_seconds(value, capsys):
    assert main(["serve", "nowhere", "--reload-every", value]) == 2
    assert "--reload-every" in capsys.readouterr().err
