"""Photo search out of the box: `index build` without --model uses the shipped default, then `search` works."""

from __future__ import annotations

import json

from PIL import Image

from vlmatch import Index, pretrained
from vlmatch.cli import main


def test_index_build_without_model_uses_the_shipped_default_and_search_ranks_the_images(tmp_path, capsys):
    model, retriever = pretrained.default_pair()
    photos = tmp_path / "photos"
    photos.mkdir()
    colours = {"red": (200, 30, 30), "green": (30, 160, 40), "blue": (30, 60, 200), "white": (245, 245, 245)}
    for name, rgb in colours.items():
        Image.new("RGB", (160, 120), rgb).save(photos / f"{name}.jpg", "JPEG")
    assert main(["index", "build", "--images", str(photos), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    assert f"--model pretrained:{model}" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["counts"]["images"] == 4 and manifest["model"]["name"] == pretrained.get(model).model
    assert manifest["score"] == pretrained.default_score()
    if retriever is not None:
        assert manifest["retriever"]["name"] == pretrained.get(retriever).model
    assert main(["search", str(tmp_path / "idx"), "a green field", "-k", "4", "--json", str(tmp_path / "r.json")]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    hits = results["results"]
    assert sorted(h["path"].split("/")[-1] for h in hits) == sorted(f"{c}.jpg" for c in colours)
    # the trained model knows its colours: green first (0.290 against 0.244 for the next when measured)
    assert hits[0]["path"].endswith("green.jpg") and hits[0]["score"] > hits[1]["score"] + 0.02, hits
    index = Index.open(tmp_path / "idx")
    assert len(index.search("a green field", k=4)) == 4


def test_explain_without_model_draws_the_shipped_explainers_maps(tmp_path, capsys):
    """`vlmatch explain --image F --text T` with no --model: the maps of the shipped default explainer (the
    model and method that point best on Flickr8k val), the maps the search page shows."""
    model, method = pretrained.default_explainer()
    assert pretrained.get(model).role in ("rescorer", "retriever")
    img = tmp_path / "dog.jpg"
    Image.new("RGB", (200, 150), (120, 90, 40)).save(img, "JPEG")
    assert main(["explain", "--image", str(img), "--text", "a brown dog", "--out", str(tmp_path / "h.png"),
                 "--json", str(tmp_path / "h.json")]) == 0
    assert f"--model pretrained:{model} --method {method}" in capsys.readouterr().out
    att = json.loads((tmp_path / "h.json").read_text())
    assert att["method"] == method
    assert (tmp_path / "h.png").stat().st_size > 1000
    grid = pretrained.get(model).features["grid"]
    weights = att["weights"]  # (image positions, words): the grid of the explainer's backbone
    assert "dog" in att["words"] and len(weights) == grid * grid and {len(w) for w in weights} == {len(att["words"])}
    assert att["grid"] == grid
