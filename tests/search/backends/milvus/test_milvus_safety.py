"""The folder index's guarantees on Milvus: other models refused at open, an interrupted build or
update resumed without duplicates or mixed models (readers keep the committed index meanwhile),
one writer at a time, an edited manifest refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("milvus_lite")
pytestmark = pytest.mark.slow  # builds killed and resumed: 4-9 s a test on milvus-lite, 15-47 s on a server

import vlmatch  # noqa: E402
from vlmatch import io  # noqa: E402
from vlmatch.errors import ConfigError, DataError, VlmatchError  # noqa: E402
from vlmatch.search.backends.base import MilvusLocation  # noqa: E402
from vlmatch.search.backends.milvus.client import LOCK, MANIFEST, PENDING, connect, read_prop, write_prop  # noqa: E402
from vlmatch.search.build import build_index, update_index  # noqa: E402

from ...photo_index import SENTENCES  # noqa: E402
from ...tiny import Tiny32, jpegs, tiny_backbone  # noqa: E402, F401  (autouse)


def _models(folder, seed=0):
    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    vocab = Vocab.build(SENTENCES, 1)
    out = {}
    for key, name in (("model", "scan_t2i_avg"), ("retriever", "vsepp")):
        torch.manual_seed(seed)
        m = create_model(name, img_dim=32, embed_dim=16, word_dim=8, vocab_size=len(vocab))
        m.vocab = vocab
        out[key] = m.save(folder / key)
    return out


@pytest.fixture(params=["lite", "server"])
def setup(request, tmp_path):
    """The same tests on milvus-lite and on a Milvus server process (the session's, emptied)."""
    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i:02d}.jpg" for i in range(9)])
    uri = _uri(request, tmp_path)
    return {"ck": ck, "photos": photos, "loc": MilvusLocation(uri, "safe"), "tmp": tmp_path, "kind": request.param}


def _uri(request, tmp_path) -> str:
    from ...conftest import empty_server

    if request.param == "lite":
        return str(tmp_path / "m.db")
    return empty_server(request.getfixturevalue("milvus_server"))


def _build(s, ck=None, **kw):
    ck = ck or s["ck"]
    return build_index(s["loc"], ck["model"], images=s["photos"], retriever_ckpt=ck["retriever"], backbone="tiny32",
                        progress=False, batch_size=2, **kw)


def _open(s, **kw):
    return vlmatch.Index.open(milvus_uri=s["loc"].uri, collection=s["loc"].collection, **kw)


def _ranking(idx, q="a red dog"):
    return [(r.id, round(r.score, 5)) for r in idx.search(q, k=len(idx), candidates=len(idx))]


def _counts(s):
    c = connect(s["loc"].uri)
    out = {}
    for name in c.list_collections():
        if name.startswith("safe__"):
            c.load_collection(name)
            out[name] = c.query(name, filter="", output_fields=["count(*)"])[0]["count(*)"]
    return out


def _kill_at(monkeypatch, step, nth):
    seen = []

    def hook(name):
        if name == step:
            seen.append(name)
            if len(seen) == nth:
                raise KeyboardInterrupt(f"simulated kill at {step} #{nth}")

    monkeypatch.setattr(io, "crash_hook", hook)


def test_opening_with_another_model_is_refused_in_one_line(setup):
    _build(setup)
    other = _models(setup["tmp"] / "other", seed=1)
    with pytest.raises(ConfigError) as e:
        _open(setup, model=other["model"])
    assert "is not the model" in str(e.value) and "\n" not in str(e.value)
    shutil.rmtree(setup["ck"]["retriever"])
    with pytest.raises(DataError, match="the retriever checkpoint .* is not here; pass its folder"):
        _open(setup)


def test_an_edited_manifest_is_refused(setup):
    _build(setup)
    c = connect(setup["loc"].uri)
    m = read_prop(c, "safe", MANIFEST)
    m["counts"]["images"] = 99
    write_prop(c, "safe", MANIFEST, m)
    with pytest.raises(DataError, match="edited after the index was written"):
        _open(setup)


@pytest.mark.parametrize("step, nth", [("milvus:batch", 2), ("milvus:commit", 1)])
def test_a_build_killed_midway_resumes_without_duplicates_or_reencoding(setup, monkeypatch, step, nth):
    _kill_at(monkeypatch, step, nth)
    with pytest.raises(KeyboardInterrupt):
        _build(setup)
    with pytest.raises(VlmatchError, match="interrupted; run the same `vlmatch index build` again"):
        _open(setup)
    seen = Tiny32.images
    monkeypatch.setattr(io, "crash_hook", None)
    m = _build(setup)
    assert Tiny32.images - seen == (9 - 4 if step == "milvus:batch" else 0)  # only what was not written yet
    assert m["counts"]["images"] == 9 and m["generation"] == 1
    assert _counts(setup) == {"safe__g1_images": 9, "safe__g1_images_enc": 9}
    assert sorted(it["id"] for it in _open(setup).items) == list(range(9))


def test_a_rebuild_with_other_models_killed_midway_leaves_the_old_index_whole_then_replaces_it(setup, monkeypatch):
    _build(setup)
    before = _ranking(_open(setup))
    other = _models(setup["tmp"] / "other", seed=1)
    _kill_at(monkeypatch, "milvus:batch", 3)
    with pytest.raises(KeyboardInterrupt):
        _build(setup, ck=other)
    assert _ranking(_open(setup)) == before  # readers still get the committed generation, one model
    monkeypatch.setattr(io, "crash_hook", None)
    m = _build(setup, ck=other)
    assert m["generation"] == 2 and set(_counts(setup)) == {"safe__g2_images", "safe__g2_images_enc"}
    assert _ranking(_open(setup, model=other["model"], retriever=other["retriever"])) != before


def test_update_adds_changes_and_removes_photos_and_resumes_after_a_kill(setup, monkeypatch):
    _build(setup)
    photos = setup["photos"]
    old_ids = {it["rel"]: it["id"] for it in _open(setup).items}
    (photos / "p00.jpg").unlink()
    jpegs(photos, ["p03.jpg"], seed=5)  # changed content
    jpegs(photos, ["n1.jpg", "n2.jpg", "n3.jpg"], seed=6)
    _kill_at(monkeypatch, "milvus:batch", 1)
    with pytest.raises(KeyboardInterrupt):
        update_index(setup["loc"], batch_size=2, progress=False)
    assert len(_open(setup)) == 9  # the manifest is the old one until the update commits
    monkeypatch.setattr(io, "crash_hook", None)
    rep = update_index(setup["loc"], batch_size=2, progress=False)
    assert rep == {"kept": 7, "new": 3, "changed": 1, "deleted": 1, "skipped": []}
    idx = _open(setup)
    items = {it["rel"]: it["id"] for it in idx.items}
    assert len(idx) == 11 and set(items) == {f"p{i:02d}.jpg" for i in range(1, 9)} | {"n1.jpg", "n2.jpg", "n3.jpg"}
    assert items["p03.jpg"] == old_ids["p03.jpg"] and sorted(items[n] for n in ("n1.jpg", "n2.jpg", "n3.jpg")) == [9, 10, 11]
    assert _counts(setup) == {"safe__g1_images": 11, "safe__g1_images_enc": 11}
    # the re-encoded photo scores as a fresh build of the same folder does
    fresh = MilvusLocation(str(setup["tmp"] / "fresh.db") if setup["kind"] == "lite" else setup["loc"].uri, "fresh")
    build_index(fresh, setup["ck"]["model"], images=photos, retriever_ckpt=setup["ck"]["retriever"],
                 backbone="tiny32", progress=False, batch_size=2)
    f = vlmatch.Index.open(milvus_uri=fresh.uri, collection="fresh")
    by_path = {r.path: r.score for r in f.search("a red dog", k=11, candidates=11)}
    got = {r.path: r.score for r in idx.search("a red dog", k=11, candidates=11)}
    assert by_path.keys() == got.keys()
    np.testing.assert_allclose([got[p] for p in by_path], list(by_path.values()), atol=1e-5)
    assert update_index(setup["loc"], progress=False) == {"kept": 11, "new": 0, "changed": 0, "deleted": 0,
                                                            "skipped": []}


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(setup):
    _build(setup)
    c = connect(setup["loc"].uri)
    import socket

    live = {"host": socket.gethostname(), "pid": os.getppid(), "what": "vlmatch index build", "token": "x", "beat": 0}
    write_prop(c, "safe", LOCK, live)
    with pytest.raises(VlmatchError) as e:
        update_index(setup["loc"], progress=False)
    assert f"is being written by process {os.getppid()}" in str(e.value) and "\n" not in str(e.value)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_prop(c, "safe", LOCK, {**live, "pid": int(dead.stdout)})
    assert update_index(setup["loc"], progress=False)["kept"] == 9
    assert read_prop(c, "safe", LOCK) is None and read_prop(c, "safe", PENDING) is None
    assert read_prop(c, "safe", MANIFEST)["counts"] == {"images": 9}


def test_a_stage2_collection_of_another_vector_type_or_size_or_gone_is_refused_at_open(setup):
    from vlmatch.search.backends.milvus.layout import Layout, create_encodings

    m = _build(setup)
    c = connect(setup["loc"].uri)
    c.drop_collection("safe__g1_images_enc")
    with pytest.raises(DataError, match="safe__g1_images_enc: missing from"):
        _open(setup)
    spec = m["collections"]["images"]["layout"]
    lay = Layout(**spec)
    assert lay.vector == "FLOAT16_PACKED"  # milvus-lite: two float16 values per FLOAT_VECTOR dimension
    create_encodings(c, "safe__g1_images_enc", Layout(**{**spec, "chunk_dim": lay.chunk_dim + 2}))
    with pytest.raises(DataError, match=f"enc field is FLOAT_VECTOR of {lay.field_dim + 1} values but the manifest "
                                        f"records FLOAT_VECTOR of {lay.field_dim}"):
        _open(setup)


def test_a_server_over_a_milvus_index_follows_its_commits(setup):
    from vlmatch.search.service import IndexBackend

    _build(setup)
    backend = IndexBackend.open(milvus_uri=setup["loc"].uri, collection="safe")
    v1 = backend.version
    assert backend.reload() is False and backend.size == 9
    jpegs(setup["photos"], ["n1.jpg", "n2.jpg"], seed=7)
    update_index(setup["loc"], batch_size=2, progress=False)
    assert backend.reload() is True and backend.size == 11 and backend.version != v1
    assert backend.path_of(10) is not None and backend.search("a red dog", 3, 11)[0]["path"].endswith(".jpg")
