"""Index build from precomp features, two-stage search, the exhaustive limit, the JSON contract."""

import json

import numpy as np
import pytest
import torch

import vlmatch
from vlmatch.cli import main
from vlmatch.data.precomp import PrecompSplit
from vlmatch.errors import VlmatchError
from vlmatch.evaluation.scoring import model_scores
from vlmatch.models.registry import load_model
from vlmatch.search.build import build_index


@pytest.fixture(scope="module")
def f32_index(toy_ckpts, small_world, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "f32"
    build_index(out, toy_ckpts["scan"], features=small_world, split="test", retriever_ckpt=toy_ckpts["vsepp"],
                dtype="float32", progress=False, captions=small_world / "test_caps.txt")
    return out


def test_exhaustive_candidates_give_the_engines_ranking(f32_index, toy_ckpts, small_world):
    idx = vlmatch.Index.open(f32_index)
    split = PrecompSplit(small_world, "test")
    sims = model_scores(load_model(toy_ckpts["scan"]), split, progress=False)  # the evaluation engine
    for j in (0, 7, 123):
        res = idx.search(split.captions[j], k=len(idx), candidates=len(idx))
        order = np.lexsort((np.arange(split.n_images), -sims[:, j].astype(np.float64)))
        assert [r.id for r in res] == order.tolist()
        np.testing.assert_allclose([r.score for r in res], sims[order, j], atol=1e-5)
        assert [r.rank for r in res] == list(range(1, len(idx) + 1))


def test_two_stage_reranks_stage1_candidates_by_the_model(f32_index):
    idx = vlmatch.Index.open(f32_index)
    q = "a small red dog next to a blue car"
    res = idx.search(q, k=5, candidates=20)
    assert len(res) == 5 and [r.score for r in res] == sorted((r.score for r in res), reverse=True)
    # the candidates are stage 1's top 20: every result's stage-1 score is among them
    _, q1 = idx.encode_queries([q])
    s1 = np.asarray(idx.images.stage1.vectors) @ q1[0]
    top20 = set(np.argsort(-s1)[:20].tolist())
    assert {idx.images.row_of[r.id] for r in res} <= top20
    for r in res:
        assert r.stage1_score == pytest.approx(float(s1[idx.images.row_of[r.id]]), abs=1e-5)
    # stage 2 re-scores: the result scores equal the model's own scores of those pairs
    ex = {r.id: r.score for r in idx.search(q, k=len(idx), candidates=len(idx))}
    assert all(r.score == pytest.approx(ex[r.id], abs=1e-6) for r in res)
    assert res[0].path == idx.path_of(res[0].id) == f"test_{res[0].id:05d}"


def test_float16_store_changes_scores_little(f32_index, toy_ckpts, small_world, tmp_path):
    build_index(tmp_path / "f16", toy_ckpts["scan"], features=small_world, split="test",
                retriever_ckpt=toy_ckpts["vsepp"], progress=False)
    a, b = vlmatch.Index.open(f32_index), vlmatch.Index.open(tmp_path / "f16")
    assert b.manifest["dtype"] == "float16" and (tmp_path / "f16/images/enc/regions.npy").stat().st_size < \
        (f32_index / "images/enc/regions.npy").stat().st_size
    q = "a big green tree"
    sa = {r.id: r.score for r in a.search(q, k=200, candidates=200)}
    sb = {r.id: r.score for r in b.search(q, k=200, candidates=200)}
    diff = max(abs(sa[i] - sb[i]) for i in sa)
    assert 0 < diff < 2e-3


def test_search_cli_table_and_json(f32_index, tmp_path, capsys):
    assert main(["search", str(f32_index), "a red dog", "-k", "3", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["rank", "score", "stage1", "file"] and len(out) == 4
    res = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["rank"] for r in res] == [1, 2, 3]
    assert all({"id", "path", "score", "stage1_score"} <= set(r) for r in res)
    assert out[1].split()[-1] == res[0]["path"]


def test_image_to_caption_search(f32_index, small_world):
    idx = vlmatch.Index.open(f32_index)
    feats = np.load(small_world / "test_ims.npy")[3]
    res = idx.search_image(feats, k=4, candidates=1000)
    assert len(res) == 4 and all(r.text for r in res)
    split = PrecompSplit(small_world, "test")
    m = load_model(f32_index / "model")
    sims = model_scores(m, split, progress=False)[3]
    assert [r.id for r in res] == np.argsort(-sims, kind="stable")[:4].tolist()


def test_manifest_describes_the_index(f32_index, toy_ckpts):
    m = json.loads((f32_index / "manifest.json").read_text())
    assert m["model"]["name"] == "scan_t2i_avg" and len(m["model"]["sha256"]) == 64
    assert m["retriever"]["name"] == "vsepp" and "retriever" in m["stage1"]
    assert m["counts"] == {"images": 200, "captions": 1000}
    assert m["dims"]["stage1"] == 32 and m["dims"]["regions"] == 8
    assert {"vlmatch", "torch", "faiss", "numpy"} <= set(m["versions"])
    assert m["collections"]["images"]["stage1"]["kind"] == "flat"


def test_no_global_part_and_no_retriever_is_a_clear_error(toy_ckpts, small_world, tmp_path, capsys):
    assert main(["index", "build", "--model", str(toy_ckpts["scan"]), "--features", str(small_world),
                 "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no global (stage-1) part" in err and "--retriever" in err and len(err.strip().splitlines()) == 1


def test_a_model_with_a_global_part_needs_no_retriever(toy_ckpts, small_world, tmp_path):
    build_index(tmp_path / "v", toy_ckpts["vsepp"], features=small_world, split="dev", progress=False, ann="hnsw")
    idx = vlmatch.Index.open(tmp_path / "v")
    assert idx.retriever is None and idx.manifest["collections"]["images"]["stage1"]["kind"] == "hnsw"
    res = idx.search("a yellow kite", k=3)
    # VSE++'s score is its stage-1 inner product: stage 1's exact scores are final
    assert idx.stage1_is_score and all(r.score == r.stage1_score for r in res)


def test_a_model_whose_score_is_its_stage1_product_skips_stage2(toy_ckpts, small_world, tmp_path, monkeypatch):
    """VSE++ alone: no encoding is fetched, and the scores are the engine's float32 scores, not the float16 store's;
    SCAN re-scored over a VSE++ retriever still fetches its candidates (stage 2 is its score)."""
    build_index(tmp_path / "v", toy_ckpts["vsepp"], features=small_world, split="test", progress=False,
                dtype="float16", captions=small_world / "test_caps.txt")
    idx = vlmatch.Index.open(tmp_path / "v")
    split = PrecompSplit(small_world, "test")
    sims = model_scores(load_model(toy_ckpts["vsepp"]), split, progress=False)
    fetched = []
    for coll in (idx.images, idx.captions):
        monkeypatch.setattr(coll, "take", lambda rows: fetched.append(rows))
    for j in (0, 11, 250):
        order = np.lexsort((np.arange(split.n_images), -sims[:, j].astype(np.float64)))[:10]
        got = idx.search(split.captions[j], k=10, candidates=30)
        assert [r.id for r in got] == order.tolist()
        np.testing.assert_allclose([r.score for r in got], sims[order, j], atol=1e-5)
    feats = np.asarray(split.features[3], np.float32)
    want = np.lexsort((np.arange(sims.shape[1]), -sims[3].astype(np.float64)))[:5]
    assert [r.id for r in idx.search_image(feats, k=5, candidates=len(split.captions))] == want.tolist()
    assert fetched == []
    build_index(tmp_path / "pair", toy_ckpts["scan"], features=small_world, split="test", progress=False,
                retriever_ckpt=toy_ckpts["vsepp"])
    pair = vlmatch.Index.open(tmp_path / "pair")
    assert not pair.stage1_is_score
    seen = []
    take = pair.images.take
    monkeypatch.setattr(pair.images, "take", lambda rows: seen.append(len(rows)) or take(rows))
    pair.search("a yellow kite", k=3, candidates=7)
    assert seen == [7]


def test_a_faiss_search_leaves_torch_its_threads(toy_ckpts, small_world, tmp_path):
    """FAISS and torch share one OpenMP runtime: the one-thread FAISS call of a single query must not
    leave the next query's text encoder and stage 2 on one thread."""
    build_index(tmp_path / "v", toy_ckpts["vsepp"], features=small_world, split="dev", progress=False, ann="hnsw")
    idx = vlmatch.Index.open(tmp_path / "v")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        idx.search("a yellow kite", k=3, candidates=5)  # fewer candidates than images: the HNSW index answers
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_open_errors_name_the_folder(tmp_path):
    with pytest.raises(VlmatchError, match="not an index folder"):
        vlmatch.Index.open(tmp_path)
    (tmp_path / "build").mkdir()
    with pytest.raises(VlmatchError, match="interrupted"):
        vlmatch.Index.open(tmp_path)


def test_score_mean_ranks_by_the_two_model_ensemble(toy_ckpts, small_world, tmp_path):
    """--score mean: stage 2 ranks by (model + retriever) / 2, exactly the ensemble `evaluate --checkpoint A B`
    averages; at full candidates the ranking is the ensemble matrix's, for text->image and image->text."""
    from vlmatch.evaluation.metrics import ensemble

    build_index(tmp_path / "mean", toy_ckpts["scan"], features=small_world, split="test", dtype="float32",
                retriever_ckpt=toy_ckpts["vsepp"], progress=False, captions=small_world / "test_caps.txt", score="mean")
    idx = vlmatch.Index.open(tmp_path / "mean")
    assert idx.manifest["score"] == "mean"
    split = PrecompSplit(small_world, "test")
    sims = ensemble([model_scores(load_model(toy_ckpts[m]), split, progress=False) for m in ("scan", "vsepp")])
    for j in (0, 7, 123):
        res = idx.search(split.captions[j], k=len(idx), candidates=len(idx))
        np.testing.assert_allclose([r.score for r in res], sims[[idx.images.row_of[r.id] for r in res], j], atol=1e-5)
        assert [r.score for r in res] == sorted((r.score for r in res), reverse=True)
        assert res[0].id == int(np.argmax(sims[:, j]))
    res = idx.search_image(np.asarray(split.features[3], dtype=np.float32), k=5, candidates=len(idx.captions))
    np.testing.assert_allclose([r.score for r in res], np.sort(sims[3])[::-1][:5], atol=1e-5)


def test_score_mean_needs_a_retriever_and_a_known_name(toy_ckpts, small_world, tmp_path):
    with pytest.raises(VlmatchError, match="--score mean .* give --retriever"):
        build_index(tmp_path / "a", toy_ckpts["vsepp"], features=small_world, split="test", score="mean")
    with pytest.raises(VlmatchError, match="--score 'max'"):
        build_index(tmp_path / "b", toy_ckpts["scan"], features=small_world, split="test",
                    retriever_ckpt=toy_ckpts["vsepp"], score="max")


@pytest.mark.parametrize("text", ["", "   ", "\u200b\u200b", "\ufeff\u00a0\u200d"])
def test_a_query_of_nothing_visible_is_refused_like_an_empty_one(f32_index, text):
    """Zero-width spaces, a BOM or NBSP alone read as an empty query: the Python API refuses them in one line, as the
    CLI and the HTTP API do (a text of only U+200B used to be searched)."""
    from vlmatch.errors import ConfigError

    with pytest.raises(ConfigError, match="non-empty text"):
        vlmatch.Index.open(f32_index).search(text)
