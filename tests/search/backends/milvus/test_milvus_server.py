"""Faults only a Milvus server brings (the embedded 2.3.5 standalone, a process of its own): killed
with -9 during a build or an update and restarted, the index is the committed version and the next
run resumes; a service whose server goes away answers 503 with Retry-After and recovers without a
restart; a search during a compaction ranks as before it; a token is never shown."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytestmark = pytest.mark.slow  # a Milvus server killed, restarted and waited on: 15-65 s a test

import vlmatch  # noqa: E402
from vlmatch import io  # noqa: E402
from vlmatch.errors import VlmatchError  # noqa: E402
from vlmatch.search.backends.base import MilvusLocation  # noqa: E402
from vlmatch.search.backends.milvus.client import LOCK, PENDING, connect, read_prop, write_prop  # noqa: E402
from vlmatch.search.build import update_index  # noqa: E402

from ...conftest import empty_server  # noqa: E402
from ...tiny import Tiny32, jpegs, tiny_backbone  # noqa: E402, F401  (autouse)
from .test_milvus_safety import _build, _counts, _models, _ranking  # noqa: E402


@pytest.fixture
def setup(milvus_server, tmp_path):
    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i:02d}.jpg" for i in range(9)])
    loc = MilvusLocation(empty_server(milvus_server), "safe")
    return {"ck": ck, "photos": photos, "loc": loc, "tmp": tmp_path, "server": milvus_server}


def _open(s, **kw):
    return vlmatch.Index.open(milvus_uri=s["loc"].uri, collection=s["loc"].collection, **kw)


def _crash_server_at(monkeypatch, server, step, nth):
    """At the nth ``step`` the server is killed with -9, and the writer dies with it."""
    seen = []

    def hook(name):
        if name == step:
            seen.append(name)
            if len(seen) == nth:
                server.kill()
                raise KeyboardInterrupt(f"server killed at {step} #{nth}")

    monkeypatch.setattr(io, "crash_hook", hook)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _release_dead_writer(loc):
    c = connect(loc.uri)
    lock = read_prop(c, loc.collection, LOCK)
    if lock:
        write_prop(c, loc.collection, LOCK, {**lock, "pid": _dead_pid()})


def _fresh_clients():
    from vlmatch.search.backends.milvus import collection as milvus_collection

    milvus_collection._CLIENTS.clear()


def test_a_server_killed_during_a_rebuild_restarts_with_the_old_version_and_the_rebuild_resumes(setup, monkeypatch):
    _build(setup)
    before = _ranking(_open(setup))
    other = _models(setup["tmp"] / "other", seed=1)
    _crash_server_at(monkeypatch, setup["server"], "milvus:batch", 3)
    with pytest.raises(KeyboardInterrupt):
        _build(setup, ck=other)
    monkeypatch.setattr(io, "crash_hook", None)
    setup["server"].start()
    _fresh_clients()
    assert _ranking(_open(setup)) == before  # the committed generation, whole, one model
    c = connect(setup["loc"].uri)
    assert read_prop(c, "safe", PENDING)["generation"] == 2
    lock = read_prop(c, "safe", LOCK)  # the writer could not release it: the server was gone
    assert lock["pid"] == os.getpid()
    write_prop(c, "safe", LOCK, {**lock, "pid": _dead_pid()})  # as if the writer had died with the server
    seen = Tiny32.images
    m = _build(setup, ck=other)  # the dead writer's lock is taken over
    assert m["generation"] == 2 and Tiny32.images - seen == 9 - 6  # resumed after the 3 batches it recorded
    assert _counts(setup) == {"safe__g2_images": 9, "safe__g2_images_enc": 9}
    assert _ranking(_open(setup, model=other["model"], retriever=other["retriever"])) != before


def test_a_server_killed_during_an_update_restarts_with_the_committed_manifest_and_the_update_finishes(setup,
                                                                                                        monkeypatch):
    _build(setup)
    jpegs(setup["photos"], ["n1.jpg", "n2.jpg", "n3.jpg"], seed=6)
    (setup["photos"] / "p00.jpg").unlink()
    _crash_server_at(monkeypatch, setup["server"], "milvus:batch", 1)
    with pytest.raises(KeyboardInterrupt):
        update_index(setup["loc"], batch_size=2, progress=False)
    monkeypatch.setattr(io, "crash_hook", None)
    setup["server"].start()
    _fresh_clients()
    _release_dead_writer(setup["loc"])
    assert len(_open(setup)) == 9  # the manifest is the committed one until the update commits
    rep = update_index(setup["loc"], batch_size=2, progress=False)
    assert rep["new"] == 3 and rep["deleted"] == 1
    idx = _open(setup)
    assert len(idx) == 11 and _counts(setup) == {"safe__g1_images": 11, "safe__g1_images_enc": 11}
    assert "p00.jpg" not in {it["rel"] for it in idx.items}


def test_a_service_answers_503_while_its_server_is_away_and_recovers_without_a_restart(setup):
    from fastapi.testclient import TestClient

    from vlmatch.search.service import IndexBackend, create_app

    _build(setup)
    _fresh_clients()
    backend = IndexBackend.open(milvus_uri=setup["loc"].uri, collection="safe")
    q = {"text": "a red dog", "k": 5, "candidates": 9}
    with TestClient(create_app(backend)) as client:
        want = client.post("/search", json=q).json()["results"]
        setup["server"].kill()
        t0 = time.time()
        r = client.post("/search", json=q)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        assert r.json()["error"] == "index_unavailable" and "did not answer" in r.json()["detail"]
        assert time.time() - t0 < 30
        setup["server"].start()
        for _ in range(30):  # the restarted server loads its collections again
            r = client.post("/search", json=q)
            if r.status_code == 200:
                break
            assert r.status_code == 503
            time.sleep(2)
        assert r.status_code == 200 and [x["id"] for x in r.json()["results"]] == [x["id"] for x in want]


def test_a_search_during_a_compaction_ranks_as_before_it(setup):
    photos = setup["photos"]
    jpegs(photos, [f"q{i:02d}.jpg" for i in range(11)], seed=8)  # 20 photos
    _build(setup)
    for name in sorted(p.name for p in photos.iterdir())[::3][:6]:  # 30 % of them go
        (photos / name).unlink()
    assert update_index(setup["loc"], batch_size=4, progress=False)["deleted"] == 6
    _fresh_clients()
    idx = _open(setup)
    before = [_ranking(idx, q) for q in ("a red dog", "grass", "a blue sky")]
    c = connect(setup["loc"].uri)
    jobs = [c.compact(name) for name in ("safe__g1_images", "safe__g1_images_enc")]
    during = []
    deadline = time.time() + 45
    while time.time() < deadline:
        during.append([_ranking(idx, q) for q in ("a red dog", "grass", "a blue sky")])
        states = [c.get_compaction_state(j) for j in jobs]
        if all(s == "Completed" for s in states):
            break
    print("compaction states", states, "searches meanwhile", len(during))
    assert during and all(d == before for d in during)
    assert [_ranking(_open(setup), q) for q in ("a red dog", "grass", "a blue sky")] == before
    assert len(idx) == 14


def test_a_search_before_the_commit_is_visible_sees_the_committed_generation(setup):
    """Consistency: a reader in another client opens right after the commit and sees every photo at once."""
    _build(setup)
    jpegs(setup["photos"], ["n1.jpg", "n2.jpg"], seed=7)
    update_index(setup["loc"], batch_size=2, progress=False)
    _fresh_clients()
    idx = _open(setup)
    m = read_prop(connect(setup["loc"].uri), "safe", "vlmatch.manifest")
    assert m["read_ts"] > 0 and len(idx) == 11
    assert len(idx.search("a red dog", k=11, candidates=11)) == 11


def test_an_index_needing_float16_vectors_is_refused_on_a_server_whose_float16_search_is_wrong(setup):
    from vlmatch.search.backends.folder import seal
    from vlmatch.search.backends.milvus.client import MANIFEST
    from vlmatch.search.backends.milvus.collection import read_manifest

    _build(setup)
    c = connect(setup["loc"].uri)
    m = read_manifest(c, setup["loc"])
    m["collections"]["images"]["layout"]["vector"] = "FLOAT16_VECTOR"  # as built on a server that has them
    m["seal"] = seal({k: v for k, v in m.items() if k != "seal"})
    write_prop(c, "safe", MANIFEST, m)
    _fresh_clients()
    with pytest.raises(VlmatchError) as e:
        _open(setup)
    assert "FLOAT16_VECTOR fields, which this server does not return or search correctly" in str(e.value)
    assert "\n" not in str(e.value)
    np.testing.assert_equal(m["capabilities"]["float16_vector"], False)


@pytest.fixture(scope="module")
def auth_server():
    """A second server, with authentication on (root:Milvus, the server's default root password)."""
    import shutil
    import tempfile

    from vlmatch_lab.milvus_server import MilvusTestServer

    base = tempfile.mkdtemp(prefix="vlmatch-milvus-auth-")
    server = MilvusTestServer(base, auth=True).start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_a_wrong_or_missing_token_is_one_line_naming_the_variable_never_the_value(auth_server, monkeypatch, capsys):
    from vlmatch.cli import main
    from vlmatch.search.backends.milvus.client import TOKEN_ENV

    args = ["search", "--backend", "milvus", "--milvus-uri", auth_server.uri, "--collection", "photos", "a dog"]
    for token in (None, "root:n0t-the-Passw0rd"):
        if token is None:
            monkeypatch.delenv(TOKEN_ENV, raising=False)
        else:
            monkeypatch.setenv(TOKEN_ENV, token)
        assert main(args) != 0
        err = capsys.readouterr().err.strip()
        assert "refused the connection: a wrong or missing token ($VLMATCH_MILVUS_TOKEN" in err and "\n" not in err
        assert ("is not set" if token is None else "is set, its value not shown") in err
        assert "n0t-the-Passw0rd" not in err
    monkeypatch.setenv(TOKEN_ENV, "root:Milvus")
    assert main(args) != 0
    assert "holds no vlmatch index" in capsys.readouterr().err  # connected: the collection is not there


def test_two_users_cannot_read_each_others_collections_where_rbac_grants_them_apart(auth_server, tmp_path, monkeypatch):
    """Milvus 2.3 RBAC: privileges per user role on named collections. alice may read the alpha index only."""
    from pymilvus import MilvusClient

    from vlmatch.search.backends.milvus.client import TOKEN_ENV
    from vlmatch.search.build import build_index

    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i}.jpg" for i in range(4)])
    monkeypatch.setenv(TOKEN_ENV, "root:Milvus")
    for name in ("alpha", "beta"):
        build_index(MilvusLocation(auth_server.uri, name), ck["model"], images=photos, retriever_ckpt=ck["retriever"],
                     backbone="tiny32", progress=False, batch_size=2)
    root = MilvusClient(uri=auth_server.uri, token="root:Milvus")
    root.create_user("alice", "alice-pass-1")
    root.create_role("alpha_reader")
    for coll in [c for c in root.list_collections() if c == "alpha" or c.startswith("alpha__g")]:
        for priv in ("Query", "Search", "Load", "GetLoadState", "GetLoadingProgress", "IndexDetail"):
            root.grant_privilege("alpha_reader", "Collection", priv, coll)
    for priv in ("DescribeCollection", "ShowCollections"):  # 2.3: these are global, not per collection
        root.grant_privilege("alpha_reader", "Global", priv, "*")
    root.grant_role("alice", "alpha_reader")
    _fresh_clients()
    monkeypatch.setenv(TOKEN_ENV, "alice:alice-pass-1")
    idx = vlmatch.Index.open(milvus_uri=auth_server.uri, collection="alpha")
    assert len(idx.search("a red dog", k=3)) == 3
    _fresh_clients()
    with pytest.raises(Exception) as e:
        vlmatch.Index.open(milvus_uri=auth_server.uri, collection="beta")
    assert "alice-pass-1" not in str(e.value)
    assert "permission" in str(e.value).lower() or "privilege" in str(e.value).lower()


def test_a_build_and_an_update_leave_the_collections_compacted(setup, monkeypatch):
    """Upserts in batches leave several segments and a delete record per row: a build and an update ask the
    server to compact both collections of the generation and wait for it (and for the merged segments' index)
    before they commit; the search after it ranks as the exhaustive scores say."""
    from pymilvus import MilvusClient

    asked, real = [], MilvusClient.compact
    monkeypatch.setattr(MilvusClient, "compact", lambda self, name, *a, **kw: asked.append(name) or real(self, name, *a,
                                                                                                           **kw))
    _build(setup)
    assert asked == ["safe__g1_images", "safe__g1_images_enc"]
    jpegs(setup["photos"], ["n1.jpg"], seed=7)
    (setup["photos"] / "p00.jpg").unlink()
    update_index(setup["loc"], batch_size=2, progress=False)
    assert asked[2:] == ["safe__g1_images", "safe__g1_images_enc"]
    c = connect(setup["loc"].uri)
    info = c.describe_index("safe__g1_images", "s1")
    assert int(info["indexed_rows"]) >= int(info["total_rows"]) and not info.get("pending_index_rows")
    _fresh_clients()
    idx = _open(setup)
    assert len(idx) == 9 and _ranking(idx) == sorted(_ranking(idx), key=lambda r: (-r[1], r[0]))
