"""Search by photo (``Index.search_like``, ``vlmatch search --like``): issue 46, item 5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vlmatch.cli import main
from vlmatch.errors import ConfigError
from vlmatch.search.index import Index
from vlmatch.search.library.similar import embedding_width, image_query

from ..like_index import like_index, resized_copy, rotated_with_tag  # noqa: F401
from ..photo_index import photo_index  # noqa: F401 -- the fixture


@pytest.fixture(scope="module")
def idx(like_index) -> Index:  # noqa: F811
    return Index.open(like_index, lean_queries=False)


def _id(idx: Index, name: str) -> int:
    return next(it["id"] for it in idx.items if Path(it["path"]).name == name)


def _names(hits) -> list[str]:
    return [Path(h.path).name for h in hits]


def _cosines(idx: Index) -> np.ndarray:
    """Brute force: every pair's cosine of the stored stage-2 image embeddings, rows in table order."""
    emb = idx.images.take(np.arange(len(idx))).embedding.float()
    emb = torch.nn.functional.normalize(emb, dim=1)
    return (emb @ emb.T).numpy()


def test_like_an_id_gives_itself_then_its_resized_and_reencoded_copies(idx):
    hits = idx.search_like(_id(idx, "photo_000.jpg"), k=3)
    assert _names(hits)[0] == "photo_000.jpg"
    assert set(_names(hits)[1:]) == {"copy_small.jpg", "copy_q40.jpg"}
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)
    assert [h.rank for h in hits] == [1, 2, 3] and hits[0].score >= hits[1].score >= hits[2].score


def test_like_a_file_outside_the_index(idx, tmp_path):
    outside = tmp_path / "elsewhere.jpg"
    resized_copy(Path(idx.path_of(_id(idx, "photo_000.jpg"))), outside, scale=0.8, quality=85)
    names = _names(idx.search_like(str(outside), k=3))
    assert set(names) == {"photo_000.jpg", "copy_small.jpg", "copy_q40.jpg"}


def test_like_gives_itself_first_and_its_rotated_copy_second(idx):
    """photo_001_rot.jpg is photo_001 stored sideways with EXIF orientation 6: read upright, it is its nearest."""
    names = _names(idx.search_like(_id(idx, "photo_001.jpg"), k=2))
    assert names == ["photo_001.jpg", "photo_001_rot.jpg"]


def test_stage2_is_the_cosine_of_the_embeddings_and_the_ranking_exhaustive(idx):
    cos = _cosines(idx)
    n = len(idx)
    for row in (0, 3, n - 1):
        item_id = idx.items[row]["id"]
        hits = idx.search_like(item_id, k=n, candidates=n)
        rows = [next(r for r, it in enumerate(idx.items) if it["id"] == h.id) for h in hits]
        assert np.allclose([h.score for h in hits], cos[row, rows], atol=1e-5)
        assert sorted(cos[row], reverse=True) == pytest.approx([h.score for h in hits], abs=1e-5)
        # fewer candidates: the same top 3 (a flat stage 1 is exact)
        assert [h.id for h in idx.search_like(item_id, k=3, candidates=4)] == [h.id for h in hits[:3]]


def test_calibrated_stage1_query_drops_the_offset_columns(idx):
    """The default model's stage-1 image vector is [v, -c(I), 1]: the image-image query keeps v only, so
    stage 1's inner product is the photos' cosine, not v.v' + c c' + 1."""
    vec = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    assert vec.shape[1] == 34 and embedding_width(idx) == 32
    q = image_query(idx, vec[:1])
    assert np.all(q[0, 32:] == 0) and np.array_equal(q[0, :32], vec[0, :32])
    hits = idx.search_like(idx.items[0]["id"], k=len(idx))
    cos = _cosines(idx)[0]
    by_id = {it["id"]: r for r, it in enumerate(idx.items)}
    assert np.allclose([h.stage1_score for h in hits], [cos[by_id[h.id]] for h in hits], atol=2e-3)


def test_text_weight_zero_and_one_are_the_two_rankings(idx):
    n = len(idx)
    item_id = _id(idx, "photo_002.jpg")
    text = "a red ball in the park"
    image_only = [h.id for h in idx.search_like(item_id, k=n, candidates=n)]
    assert [h.id for h in idx.search_like(item_id, k=n, candidates=n, text=text, text_weight=0.0)] == image_only
    text_only = [h.id for h in idx.search(text, k=n, candidates=n)]
    assert [h.id for h in idx.search_like(item_id, k=n, candidates=n, text=text, text_weight=1.0)] == text_only
    mixed = idx.search_like(item_id, k=n, candidates=n, text=text)
    # the default weight: each score standardised over the candidates, then averaged
    t = {h.id: h.score for h in idx.search(text, k=n, candidates=n)}
    i = {h.id: h.score for h in idx.search_like(item_id, k=n, candidates=n)}
    ids = list(t)
    zt = (np.array([t[j] for j in ids]) - np.mean(list(t.values()))) / np.std(list(t.values()))
    zi = (np.array([i[j] for j in ids]) - np.mean(list(i.values()))) / np.std(list(i.values()))
    want = dict(zip(ids, 0.5 * zt + 0.5 * zi, strict=True))
    assert [h.score for h in mixed] == pytest.approx([want[h.id] for h in mixed], abs=1e-4)


def test_where_is_passed_to_stage1_only_when_given(idx, monkeypatch):
    seen = []
    search = idx.images.search

    def recording(queries, k, **kw):
        seen.append(kw)
        return search(queries, k)

    monkeypatch.setattr(idx.images, "search", recording)
    idx.search_like(0, k=2)
    idx.search_like(0, k=2, text="a dog on the grass", where="FILTER")
    assert seen == [{}, {"where": "FILTER"}, {"where": "FILTER"}]


def test_attention_model_ranks_by_its_retrievers_image_similarity(photo_index):  # noqa: F811
    """SCAN has no image-image score: the ranking is stage 1's (the VSE++ retriever's), reported as both scores."""
    idx = Index.open(photo_index, lean_queries=False)
    n = len(idx)
    hits = idx.search_like(idx.items[5]["id"], k=n, candidates=n)
    assert hits[0].id == idx.items[5]["id"]
    assert [h.score for h in hits] == [h.stage1_score for h in hits]
    vec = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    assert [h.stage1_score for h in hits] == pytest.approx(sorted(vec @ image_query(idx, vec[5:6])[0], reverse=True),
                                                          abs=1e-5)


def test_bad_like_arguments(idx, tmp_path):
    with pytest.raises(ConfigError, match="no image with that id"):
        idx.search_like(10_000)
    with pytest.raises(ConfigError, match="no such photo file"):
        idx.search_like(str(tmp_path / "missing.jpg"))
    with pytest.raises(ConfigError, match="between 0 and 1"):
        idx.search_like(0, text="a dog", text_weight=1.5)
    with pytest.raises(ConfigError, match="non-empty"):
        idx.search_like(0, text="  ")


def test_cli_search_like_id_path_and_text(idx, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["search", str(idx.root), "--like", str(_id(idx, "photo_000.jpg")), "-k", "3",
                 "--json", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].endswith("photo_000.jpg")
    rec = json.loads(out.read_text())
    assert rec["query"] == {"like": str(_id(idx, "photo_000.jpg")), "text": None}
    assert {Path(r["path"]).name for r in rec["results"]} == {"photo_000.jpg", "copy_small.jpg", "copy_q40.jpg"}
    photo = idx.path_of(_id(idx, "photo_003.jpg"))
    assert main(["search", str(idx.root), "at night", "--like", photo, "-k", "2", "--text-weight", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("photo_003.jpg")
    # the text may follow the photo (argparse takes the positionals before the first option)
    assert main(["search", str(idx.root), "--like", photo, "at night", "-k", "2", "--text-weight", "0",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["query"] == {"like": photo, "text": "at night"}


@pytest.mark.parametrize("args, message", [
    (["--like", "nothing_here.jpg"], "neither a photo file nor an indexed id"),
    (["--like", "3", "--image", "x.jpg"], "two different searches"),
    (["--like", "3", "--text-weight", "0.3"], "give a query text too"),
    (["a dog", "--text-weight", "0.3"], "goes with --like"),
    (["--like", "3", "a dog", "at night"], "at most one text"),
    (["a dog", "--like", "3", "at night"], "two query texts"),
])
def test_cli_like_errors_are_one_line(idx, capsys, args, message):
    assert main(["search", str(idx.root), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("vlmatch: error:")


def test_cli_text_weight_out_of_range(idx, capsys):
    with pytest.raises(SystemExit):
        main(["search", str(idx.root), "x", "--like", "0", "--text-weight", "2"])
    assert "between 0 and 1" in capsys.readouterr().err


def test_rotated_copy_helper_is_upright_when_the_tag_is_applied(tmp_path):
    from PIL import Image, ImageOps

    from ..photo_index import draw_photos

    src = draw_photos(tmp_path / "p", 1) / "photo_000.jpg"
    rotated_with_tag(src, tmp_path / "rot.jpg")
    with Image.open(tmp_path / "rot.jpg") as im:
        assert im.getexif()[0x0112] == 6
        upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"), dtype=float)
    with Image.open(src) as im:
        assert np.abs(upright - np.asarray(im.convert("RGB"), dtype=float)).mean() < 6


def test_a_text_pools_both_candidate_lists_and_standardises_over_the_pool(idx):
    """With few candidates the photo's and the text's stage-1 lists differ: the pool is their union, each
    candidate scored by its exact image similarity and text score, both standardised over the pool."""
    n = len(idx)
    item_id, text, cand = _id(idx, "photo_000.jpg"), "two people walk on the beach at sunset", 3
    img_top = [h.id for h in idx.search_like(item_id, k=cand, candidates=cand)]
    txt_top = [h.id for h in idx.search(text, k=cand, candidates=cand)]
    pool = set(img_top) | set(txt_top)
    assert len(pool) > cand  # the two lists differ here (else this test shows nothing)
    hits = idx.search_like(item_id, k=cand, candidates=cand, text=text, text_weight=0.3)  # (candidates >= k)
    t = {h.id: h.score for h in idx.search(text, k=n, candidates=n)}
    i = {h.id: h.score for h in idx.search_like(item_id, k=n, candidates=n)}
    ids = sorted(pool)
    tv, iv = np.array([t[j] for j in ids]), np.array([i[j] for j in ids])
    want = dict(zip(ids, 0.3 * (tv - tv.mean()) / tv.std() + 0.7 * (iv - iv.mean()) / iv.std(), strict=True))
    best = sorted(ids, key=lambda j: -want[j])[:cand]
    assert [h.id for h in hits] == best
    assert [h.score for h in hits] == pytest.approx([want[j] for j in best], abs=1e-4)
    assert [h.stage1_score for h in hits] == pytest.approx([i[j] for j in best], abs=2e-3)


def test_a_text_on_a_mean_scored_index_uses_the_fused_text_score(tmp_path):
    """An index built with score "mean" (SCAN re-scoring over a VSE++ retriever) ranks a text by the mean of
    the two models' scores; with --like and text_weight 1 the pool is ranked by exactly that score, the
    retriever's part computed from the stored vectors for candidates the text's stage 1 did not return."""
    from vlmatch.search.build import build_index

    from ..photo_index import draw_photos, save_models

    ck = save_models(tmp_path / "ckpt")
    build_index(tmp_path / "index", ck["model"], images=draw_photos(tmp_path / "photos", 10),
                retriever_ckpt=ck["retriever"], backbone="efficientnet-lite0", progress=False, score="mean")
    idx = Index.open(tmp_path / "index", lean_queries=False)
    n, text, cand = len(idx), "a blue car on a street", 3
    item_id = idx.items[4]["id"]
    pool = ({h.id for h in idx.search_like(item_id, k=cand, candidates=cand)}
            | {h.id for h in idx.search(text, k=cand, candidates=cand)})
    exact = {h.id: h.score for h in idx.search(text, k=n, candidates=n)}  # the fused score of every photo
    best = sorted(pool, key=lambda j: -exact[j])[:cand]
    hits = idx.search_like(item_id, k=cand, candidates=cand, text=text, text_weight=1.0)
    assert [h.id for h in hits] == best
    v = np.array([exact[j] for j in sorted(pool)])
    z = {j: (exact[j] - v.mean()) / v.std() for j in pool}
    assert [h.score for h in hits] == pytest.approx([z[j] for j in best], abs=1e-4)
