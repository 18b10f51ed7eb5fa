"""The HTTP API over a real index (a folder of JPEGs, built by the index code): what the service
answers is what ``vlmatch.Index`` answers, and the files and heat maps are the indexed ones."""

import io
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import vlmatch
from vlmatch.search.service import IndexBackend, create_app

from ..photo_index import photo_index  # noqa: F401  (the session fixture)


@pytest.fixture(scope="module")
def served(photo_index):  # noqa: F811
    idx = vlmatch.Index.open(photo_index)
    with TestClient(create_app(IndexBackend(idx))) as c:
        yield c, idx


def test_health_describes_the_index(served):
    c, idx = served
    h = c.get("/health").json()
    assert (h["model"], h["index_size"], h["captions"]) == ("scan_t2i_avg", 16, 6)


def test_search_is_the_index_ranking(served):
    c, idx = served
    body = c.post("/search", json={"text": "a dog on the grass", "k": 5, "candidates": 16}).json()
    want = idx.search("a dog on the grass", k=5, candidates=16)
    assert [r["id"] for r in body["results"]] == [r.id for r in want]
    np.testing.assert_allclose([r["score"] for r in body["results"]], [r.score for r in want], rtol=1e-5)
    np.testing.assert_allclose([r["stage1_score"] for r in body["results"]], [r.stage1_score for r in want], rtol=1e-5)
    # the page shows paths inside the photo folder; Python (and the CLI) keep the absolute ones
    root = idx.manifest["source"]["root"]
    assert [r["path"] for r in body["results"]] == [str(Path(r.path).relative_to(root)) for r in want]
    assert all(Path(r.path).is_absolute() for r in want)
    assert not any(Path(r["path"]).is_absolute() or root in r["path"] for r in body["results"])


def test_files_are_the_indexed_ones(served):
    c, idx = served
    item = idx.items[3]
    r = c.get(f"/images/{item['id']}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    with open(item["path"], "rb") as f:
        assert r.content == f.read()
    t = c.get(f"/thumbs/{item['id']}")
    w, h = Image.open(item["path"]).size
    assert t.status_code == 200 and Image.open(io.BytesIO(t.content)).size == (256 * w // max(w, h), 256 * h // max(w, h))


def test_explain_gives_one_grid_map_per_word(served):
    c, idx = served
    ex = c.get("/explain/5", params={"text": "a dog on the grass", "method": "attention"}).json()
    att = idx.explain(5, "a dog on the grass", "attention")
    assert ex["words"] == att.words and ex["grid"] == [7, 7] and ex["axis"] == "regions"
    assert ex["method"] == "attention"
    w = np.array(ex["weights"])
    assert w.shape == (len(att.words), 49)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-4)  # each word's weights over the 49 cells
    np.testing.assert_allclose(w, att.weights.T, rtol=1e-5)
    png = c.get("/explain/5.png", params={"text": "a dog on the grass"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).format == "PNG"


@pytest.mark.parametrize("method", ["contribution", "gradient", "occlusion"])
def test_explain_by_method_is_the_index_answer_and_says_its_method(served, method):
    c, idx = served
    ex = c.get("/explain/5", params={"text": "a dog on the grass", "method": method}).json()
    att = idx.explain(5, "a dog on the grass", method)
    assert ex["method"] == att.method == method and ex["words"] == att.words and ex["grid"] == [7, 7]
    np.testing.assert_allclose(np.array(ex["weights"]), att.weights.T, rtol=1e-4, atol=1e-7)
    if method == "contribution":  # the exact shares: they sum to the pair's score
        assert float(att.weights.sum()) == pytest.approx(att.score, rel=1e-4, abs=1e-6)
    else:  # a query per word: the caption's words
        assert att.words == "a dog on the grass".split()
    png = c.get("/explain/5.png", params={"text": "a dog on the grass", "method": method})
    assert png.status_code == 200 and Image.open(io.BytesIO(png.content)).format == "PNG"


def test_explain_default_method_and_unknown_method(served):
    from vlmatch.evaluation.explainers import default_method

    c, idx = served
    ex = c.get("/explain/5", params={"text": "a dog"}).json()
    assert ex["method"] == default_method(idx.model)
    bad = c.get("/explain/5", params={"text": "a dog", "method": "magic"})
    assert bad.status_code == 422


def test_image_search_by_upload_and_by_id(served):
    c, idx = served
    data = open(idx.items[2]["path"], "rb").read()
    up = c.post("/search/image", files={"image": ("p.jpg", data, "image/jpeg")}, data={"k": "3"}).json()
    want = idx.search_image(data, k=3)
    assert [r["text"] for r in up["results"]] == [r.text for r in want]
    by_id = c.post("/search/image", data={"id": str(idx.items[2]["id"]), "k": "3"}).json()
    assert [r["text"] for r in by_id["results"]] == [r.text for r in want]  # same file, same features


def test_the_index_explains_with_the_model_that_records_the_better_pointing(served, monkeypatch):
    import vlmatch.pretrained as pretrained

    c, idx = served
    monkeypatch.setattr(idx, "_shipped_explainer", False)  # as where the shipped explainer's backbone is missing
    # models that do not ship record nothing: the stage-2 model with its best method
    assert idx.explainer()[0] is idx.model
    records = {"retriever": {"method": "occlusion", "pointing": 60.0}, "model": {"method": "attention", "pointing": 34.0}}
    part_of = {str(idx.parts[k]): k for k in ("model", "retriever")}
    monkeypatch.setattr(pretrained, "explainer_record", lambda folder: records[part_of[str(folder)]])
    model, method = idx.explainer()
    assert model is idx.retriever and method == "occlusion"
    att = idx.explain(5, "a dog on the grass")
    assert att.method == "occlusion" and att.words == "a dog on the grass".split()
    retriever_score = float(idx.retriever.score(*_encode(idx.retriever, idx, 5, "a dog on the grass")))
    assert att.score == pytest.approx(retriever_score, rel=1e-4)  # the retriever's maps, not the re-scorer's
    assert idx.explainer("attention")[0] is idx.model  # the retriever has no attention: the one that has


def _encode(model, idx, item_id, text):
    import torch

    feats = idx.image_features(idx.items[[it["id"] for it in idx.items].index(item_id)]["path"])
    with torch.no_grad():
        return model.encode_images(feats), model.encode_texts(*model.tokenize([text]))


def test_the_shipped_explainer_draws_the_maps_when_it_points_better_than_the_index_s_models(served, monkeypatch):
    """The index's toy models record no pointing figure: by default the shipped explainer (``vlmatch explain``'s)
    reads the photo again with its own backbone and draws the maps, named in the answer; a method asked for
    by name is the index's own models' (the shipped explainer does not replace them)."""
    import vlmatch.pretrained as pretrained

    c, idx = served
    name, method = pretrained.default_explainer()
    entry = pretrained.get(name)
    monkeypatch.setattr(idx, "_shipped_explainer", None)
    model, got = idx.explainer()
    assert got == method and model is not idx.model and model is not idx.retriever
    att = idx.explain(5, "a dog on the grass")
    assert att.model == f"pretrained:{name}" and att.method == method and att.grid == entry.features["grid"]
    assert att.weights.shape[0] == entry.features["grid"] ** 2
    body = c.get("/explain/5", params={"text": "a dog on the grass"}).json()
    assert body["model"] == f"pretrained:{name}" and body["grid"] == [att.grid, att.grid]
    np.testing.assert_allclose(np.array(body["weights"]).T, att.weights, rtol=1e-5, atol=1e-6)
    assert idx.explainer("attention")[0] is idx.model  # by name: the index's model that has the method
    # an index model that records a better pointing figure than the shipped explainer keeps the maps
    monkeypatch.setattr(idx, "_shipped_explainer", None)
    better = {"method": "contribution", "pointing": entry.explainer["pointing"] + 1}
    monkeypatch.setattr(pretrained, "explainer_record", lambda folder: better if str(folder) == str(idx.parts["model"])
                        else None)
    assert idx.explainer() == (idx.model, "contribution")


def test_an_explainer_recorded_with_mirror_views_explains_with_them(served, monkeypatch):
    """A model whose shipped record says ``mirror`` explains with the photo's mirror view too: the maps are the
    mean of the two views' (as :func:`explain_pair` makes them from both views' features), the score the photo's;
    ``mirror=False`` (``--no-mirror``) and a text naming a side keep the photo's alone."""
    import vlmatch.pretrained as pretrained
    from vlmatch.viz.attention import explain_pair

    c, idx = served
    monkeypatch.setattr(idx, "_shipped_explainer", False)
    record = {"method": "contribution", "pointing": 90.0, "mirror": True}
    monkeypatch.setattr(pretrained, "explainer_record",
                        lambda folder: record if str(folder) == str(idx.parts["model"]) else None)
    att = idx.explain(5, "a dog on the grass")
    path = next(it["path"] for it in idx.items if it["id"] == 5)
    views = idx.image_features(path, mirror=True).numpy()
    want = explain_pair(idx.model, views[0], "a dog on the grass", "contribution", mirror_features=views[1])
    assert att.mirror_score is not None and att.method == "contribution"
    np.testing.assert_allclose(att.weights, want.weights, rtol=1e-5, atol=1e-7)
    alone = idx.explain(5, "a dog on the grass", mirror=False)
    assert alone.mirror_score is None and att.score == pytest.approx(alone.score, rel=1e-5)
    assert idx.explain(5, "a dog on the left").mirror_score is None
    body = c.get("/explain/5", params={"text": "a dog on the grass"}).json()
    # score: the one search shows (from the stored encoding); maps_score: the photo's own, which the maps split
    assert body["mirrored"] is True and body["maps_score"] == pytest.approx(att.score, rel=1e-5)
    assert body["score"] == pytest.approx(att.shown_score, rel=1e-5)
