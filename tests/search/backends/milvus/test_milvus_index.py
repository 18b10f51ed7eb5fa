"""The Milvus backend gives the folder index's results: the same photos (a folder of drawn JPEGs,
EfficientNet-Lite0 features, SCAN t-i + VSE++), queries and pairs give the same ranked ids and
scores on both; the CLI and the HTTP service open it the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("milvus_lite")
pytestmark = pytest.mark.slow  # every test builds Milvus Lite collections beside a folder index: seconds each

import vlmatch  # noqa: E402
from vlmatch.cli import main  # noqa: E402
from vlmatch.search.backends.base import MilvusLocation  # noqa: E402
from vlmatch.search.build import build_index  # noqa: E402

from ...photo_index import SENTENCES, draw_photos, save_models  # noqa: E402

QUERIES = SENTENCES + ["a yellow thing under a dark sky", "grass"]


@pytest.fixture(scope="module")
def folder_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("milvus_pair")
    ck = save_models(root / "ckpt")
    photos = draw_photos(root / "photos", 20)
    captions = root / "captions.txt"
    captions.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    opts = dict(images=photos, captions=captions, retriever_ckpt=ck["retriever"], backbone="efficientnet-lite0",
                progress=False, batch_size=8)
    build_index(root / "index", ck["model"], **opts)
    return {"folder": root / "index", "photos": photos, "ckpt": ck, "root": root, "opts": opts}


@pytest.fixture(scope="module", params=["lite", pytest.param("server", marks=pytest.mark.slow)])
def both(request, folder_index):
    """The folder index and the same photos in Milvus: milvus-lite, or a Milvus server process (the session's)."""
    if request.param == "lite":
        uri = str(folder_index["root"] / "m.db")
    else:
        from ...conftest import empty_server

        uri = empty_server(request.getfixturevalue("milvus_server"))
    loc = MilvusLocation(uri, "photos")
    manifest = build_index(loc, folder_index["ckpt"]["model"], **folder_index["opts"])
    return {**folder_index, "loc": loc, "manifest": manifest, "kind": request.param}


def _open(both):
    return (vlmatch.Index.open(both["folder"]),
            vlmatch.Index.open(milvus_uri=both["loc"].uri, collection=both["loc"].collection))


def _same(ra, rb, tol=1e-4):
    assert [r.id for r in ra] == [r.id for r in rb]
    assert [r.path or r.text for r in ra] == [r.path or r.text for r in rb]
    np.testing.assert_allclose([r.score for r in ra], [r.score for r in rb], atol=tol)
    np.testing.assert_allclose([r.stage1_score for r in ra], [r.stage1_score for r in rb], atol=tol)


def test_the_manifest_records_models_backbone_format_and_a_chunked_float_layout(both):
    m = both["manifest"]
    assert m["format"] == "milvus-1" and m["backbone"]["name"] == "efficientnet-lite0"
    assert len(m["model"]["digest"]) == 64 and len(m["retriever"]["digest"]) == 64
    lay = m["collections"]["images"]["layout"]
    # milvus-lite refuses FLOAT16_VECTOR, 2.3.5 searches it wrong: float16 values packed two to a FLOAT_VECTOR dimension
    assert lay["vector"] == "FLOAT16_PACKED" and lay["chunks"] == 1 and m["counts"] == {"images": 20, "captions": 6}
    caps = m["capabilities"]
    assert caps["float16_vector"] is False and {"FLAT", "IVF_FLAT", "HNSW"} <= set(caps["index_types"])
    assert caps["vector_fields"] == (2 if both["kind"] == "lite" else 1)  # 2.3 servers: one vector field


@pytest.mark.parametrize("candidates", [5, 12, None])
def test_text_queries_rank_the_same_ids_with_the_same_scores_on_both_backends(both, candidates):
    a, b = _open(both)
    assert len(a) == len(b) == 20
    for q in QUERIES:
        _same(a.search(q, k=8, candidates=candidates), b.search(q, k=8, candidates=candidates))


def test_an_image_query_ranks_the_same_captions_and_attention_is_the_same(both):
    a, b = _open(both)
    for name in ("photo_002.jpg", "photo_013.jpg"):
        _same(a.search_image(both["photos"] / name, k=6), b.search_image(both["photos"] / name, k=6))
    ea, eb = a.explain(7, "a red ball"), b.explain(7, "a red ball")
    np.testing.assert_allclose(ea.weights, eb.weights, atol=1e-5)
    assert ea.image == eb.image and ea.grid == eb.grid and ea.model == eb.model  # the same explainer on both
    assert b.path_of(7) == a.path_of(7) and b.items == a.items


def test_the_cli_builds_searches_and_serves_a_milvus_index(both, tmp_path, capsys):
    from vlmatch.search.service import IndexBackend

    db = tmp_path / "cli.db" if both["kind"] == "lite" else both["loc"].uri
    args = ["--backend", "milvus", "--milvus-uri", str(db), "--collection", "cli_photos"]
    assert main(["index", "build", "--model", str(both["ckpt"]["model"]), "--retriever", str(both["ckpt"]["retriever"]),
                 "--images", str(both["photos"]), "--backbone", "efficientnet-lite0", "--no-progress", *args]) == 0
    assert '"images": 20' in capsys.readouterr().out
    assert main(["search", *args, "a dog on the grass", "-k", "3", "--json", str(tmp_path / "r.json")]) == 0
    got = json.loads((tmp_path / "r.json").read_text())
    want = vlmatch.Index.open(both["folder"]).search("a dog on the grass", k=3)
    assert [r["id"] for r in got["results"]] == [r.id for r in want]
    assert "milvus collection cli_photos" in got["index"]
    be = IndexBackend.open(milvus_uri=str(db), collection="cli_photos")
    assert be.size == 20 and be.path_of(3) is not None and be.path_of(999) is None
    assert main(["search", "--backend", "milvus", "--milvus-uri", str(db), "a dog"]) == 2
    assert "--backend milvus needs --milvus-uri URI and --collection NAME" in capsys.readouterr().err


def test_explain_draws_an_indexed_photo_from_either_backend(both, tmp_path, capsys):
    loc = both["loc"]
    args = ["--backend", "milvus", "--milvus-uri", loc.uri, "--collection", loc.collection]
    for name, where in (("m", args), ("f", ["--index", str(both["folder"])])):
        out = tmp_path / f"{name}.png"
        assert main(["explain", "--id", "7", "--text", "a red ball", "--out", str(out), "--json",
                     str(tmp_path / f"{name}.json"), *where]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    m, f = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "mf")
    np.testing.assert_allclose(m["weights"], f["weights"], atol=1e-5)
    assert main(["explain", "--id", "7", "--text", "a", "--out", str(tmp_path / "x.png"), "--image", "y.jpg",
                 *args]) == 2
    assert "drop --image" in capsys.readouterr().err


def test_the_http_service_over_a_milvus_index_answers_as_over_the_folder(both):
    from fastapi.testclient import TestClient

    from vlmatch.search.service import IndexBackend, create_app

    a, b = _open(both)
    with TestClient(create_app(IndexBackend(a))) as ca, TestClient(create_app(IndexBackend(b))) as cb:
        q = {"text": "a red ball in the park", "k": 5, "candidates": 10}
        ra, rb = ca.post("/search", json=q).json()["results"], cb.post("/search", json=q).json()["results"]
        assert [r["id"] for r in ra] == [r["id"] for r in rb]
        np.testing.assert_allclose([r["score"] for r in ra], [r["score"] for r in rb], atol=1e-4)
        assert cb.get("/health").json()["index_size"] == 20
        assert cb.get("/images/4").content == ca.get("/images/4").content
        assert cb.get("/images/999").status_code == 404
        assert cb.get("/explain/4.png", params={"text": "a dog"}).headers["content-type"] == "image/png"


@pytest.mark.parametrize("ann", ["flat", "hnsw", "ivf"])
def test_an_index_of_precomp_features_matches_the_folders_for_each_stage1_kind(tmp_path, ann):
    from tests.conftest import write_precomp

    from .test_milvus_safety import _models

    rng = np.random.default_rng(3)
    write_precomp(tmp_path / "pre", "test", rng.standard_normal((60, 4, 32)), ["x"] * 60,
                  ids=[f"im{i}.jpg" for i in range(60)])
    ck = _models(tmp_path / "ck")
    opts = dict(features=tmp_path / "pre", retriever_ckpt=ck["retriever"], ann=ann, progress=False, batch_size=16,
                **({"nlist": 4} if ann == "ivf" else {}))
    build_index(tmp_path / "index", ck["model"], **opts)
    loc = MilvusLocation(str(tmp_path / "f.db"), "feats")
    m = build_index(loc, ck["model"], **opts)
    assert m["collections"]["images"]["stage1"]["kind"] == ann
    a = vlmatch.Index.open(tmp_path / "index")
    b = vlmatch.Index.open(milvus_uri=loc.uri, collection="feats")
    assert a.items == b.items and b.items[5]["path"] == "im5.jpg"
    for q in SENTENCES:
        _same(a.search(q, k=10, candidates=60), b.search(q, k=10, candidates=60))  # exhaustive on both
        if ann != "ivf":  # IVF probes lists from its own k-means: the two engines train different ones
            _same(a.search(q, k=5, candidates=20), b.search(q, k=5, candidates=20))
