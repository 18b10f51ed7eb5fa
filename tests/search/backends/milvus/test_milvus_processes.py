"""A Milvus index as a user runs it: build, update, search, explain and serve each in a process of its
own (a later process must open what an earlier one wrote: milvus-lite releases a collection when its
writer exits, and says so as 'in state released'), on milvus-lite and on a Milvus server."""

from __future__ import annotations

import pytest

pytest.importorskip("milvus_lite")
pytestmark = pytest.mark.slow  # every step a process of its own: 25-50 s a test

from ...serving import free_port, wait_until_serving  # noqa: E402
from ...tiny import child, jpegs, run_child  # noqa: E402
from .test_milvus_safety import _models  # noqa: E402


def _ok(r):
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "MilvusException" not in r.stderr and "mvccTs" not in r.stderr, r.stderr
    return r


def _serve_answers(milvus: list[str]) -> dict:
    import httpx

    port = str(free_port())
    proc = child(["serve", *milvus, "--port", port, "--log-level", "warning"])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base, 90, lambda: proc.stderr.read()[-2000:])
        out = {"search": httpx.get(base + "/search", params={"q": "a red dog", "k": 3}, timeout=30),
               "filtered": httpx.get(base + "/search", params={"q": "a red dog", "camera": "canon"}, timeout=30),
               "newline": httpx.get(base + "/search", params={"q": "a red dog", "camera": "a\nb"}, timeout=30)}
    finally:
        proc.terminate()
        proc.wait(20)
    return out


def _every_step_in_its_own_process(uri: str, tmp_path):
    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i:02d}.jpg" for i in range(5)])
    milvus = ["--backend", "milvus", "--milvus-uri", uri, "--collection", "photos"]
    _ok(run_child(["index", "build", *milvus, "--model", ck["model"], "--retriever", ck["retriever"], "--images",
                   photos, "--backbone", "tiny32", "--no-progress", "--batch-size", "2"]))
    r = _ok(run_child(["search", *milvus, "a red dog", "-k", "3"]))
    assert r.stdout.count(".jpg") == 3
    _ok(run_child(["search", *milvus, "a red dog", "--camera", "canon", "--after", "2001-01-01"]))
    jpegs(photos, ["new.jpg"], seed=3)
    r = _ok(run_child(["index", "update", *milvus, "--no-progress", "--batch-size", "2"]))
    assert '"new": 1' in r.stdout
    r = _ok(run_child(["search", *milvus, "a red dog", "-k", "6"]))
    assert "new.jpg" in r.stdout
    _ok(run_child(["explain", *milvus, "--id", "1", "--text", "a red dog", "--out", tmp_path / "e.png",
                   "--backbone", "tiny32"]))
    assert (tmp_path / "e.png").stat().st_size > 0
    got = _serve_answers(milvus)
    assert got["search"].status_code == 200 and len(got["search"].json()["results"]) == 3
    assert got["filtered"].status_code == 200 and got["filtered"].json()["results"] == []
    assert got["newline"].status_code == 400 and got["newline"].json()["error"] == "bad_filter"


def test_a_milvus_lite_index_opens_in_every_later_process(tmp_path):
    _every_step_in_its_own_process(str(tmp_path / "lib.db"), tmp_path)


def test_a_milvus_server_index_opens_in_every_later_process(milvus_server, tmp_path):
    from ...conftest import empty_server

    _every_step_in_its_own_process(empty_server(milvus_server), tmp_path)
