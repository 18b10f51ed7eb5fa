"""Photo search out of the box: `index build` without --model uses the shipped default, then `search` works."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from vlmatch import Index, pretrained
from vlmatch.cli import main

COLOURS = {"red": (200, 30, 30), "green": (30, 160, 40), "blue": (30, 60, 200), "white": (245, 245, 245)}


def _build_and_search(tmp_path, capsys, args: list[str]) -> dict:
    """`index build` of four colour photos with ``args``, then `search "a green field"`: the manifest."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for name, rgb in COLOURS.items():
        Image.new("RGB", (160, 120), rgb).save(photos / f"{name}.jpg", "JPEG")
    assert main(["index", "build", "--images", str(photos), "--out", str(tmp_path / "idx"), "--no-progress",
                 *args]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    manifest["_out"] = out
    assert manifest["counts"]["images"] == 4
    assert main(["search", str(tmp_path / "idx"), "a green field", "-k", "4", "--json", str(tmp_path / "r.json")]) == 0
    hits = json.loads((tmp_path / "r.json").read_text())["results"]
    assert sorted(h["path"].split("/")[-1] for h in hits) == sorted(f"{c}.jpg" for c in COLOURS)
    # the trained models know their colours: green first, by a margin
    assert hits[0]["path"].endswith("green.jpg") and hits[0]["score"] > hits[1]["score"] + 0.02, hits
    assert len(Index.open(tmp_path / "idx").search("a green field", k=4)) == 4
    return manifest


@pytest.mark.slow  # the shipped default's index build
def test_index_build_without_model_uses_the_shipped_default_and_search_ranks_the_images(tmp_path, capsys):
    model, retriever = pretrained.default_pair()
    manifest = _build_and_search(tmp_path, capsys, [])
    assert f"--model pretrained:{model}" in manifest["_out"]
    assert manifest["model"]["name"] == pretrained.get(model).model
    assert manifest["score"] == pretrained.default_score()
    assert manifest["backbone"] == pretrained.get(model).features
    if retriever is not None:
        assert manifest["retriever"]["name"] == pretrained.get(retriever).model


def test_the_first_shipped_pair_stays_available_by_name(tmp_path, capsys):
    """The faster pair of earlier releases (EfficientNet-Lite0 224 px) keeps its registry entries: indexes built
    with it keep opening, and `--model/--retriever pretrained:NAME` builds one."""
    manifest = _build_and_search(tmp_path, capsys, ["--model", "pretrained:scan-t2i-minilm-f8k", "--retriever",
                                                    "pretrained:vsepp-minilm-f8k", "--score", "mean"])
    assert manifest["backbone"]["name"] == "efficientnet-lite0" and manifest["backbone"]["input_size"] == 224
    assert manifest["model"]["name"] == "scan_t2i_avg" and manifest["retriever"]["name"] == "vsepp"


@pytest.mark.slow  # the shipped explainer
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


@pytest.mark.slow  # the shipped best model
def test_the_best_shipped_model_builds_by_name(tmp_path, capsys):
    """The slower, better model (Lite2 448 px, 360.8 val rsum calibrated) is one name away, alone (its own stage 1)."""
    manifest = _build_and_search(tmp_path, capsys, ["--model", "pretrained:vsepp-lite2-448-lora-f8k"])
    assert manifest["backbone"]["name"] == "efficientnet-lite2" and manifest["backbone"]["input_size"] == 448
    assert manifest["model"]["name"] == "vsepp" and manifest["retriever"] is None
    assert not pretrained.get("vsepp-lite2-448-lora-f8k").default
