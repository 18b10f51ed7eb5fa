"""The model card: generated from the registry, and what README.md and the docs hold is exactly that."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vlmatch import pretrained
from vlmatch.errors import DataError
from vlmatch.pretrained import card

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_model_has_a_row_and_a_section_with_its_figures():
    found = pretrained.entries()
    assert found, "the package ships at least one model"
    text = card.render(found)
    for e in found:
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| `pretrained:{e.name}` |"))
        assert f"| {e.val_rsum:.1f} |" in row and f"| {e.model} |" in row and f"| {e.role} |" in row
        assert f"### `pretrained:{e.name}`" in text
        assert e.sha256[:16] in text and e.command in text and e.notes in text


def test_search_figures_appear_when_measured_and_not_otherwise():
    e = pretrained.entries()[0]
    bare = card.render([dataclasses.replace(e, search={})])
    assert "images/s" not in bare and "p99" not in bare
    full = card.render([dataclasses.replace(e, search={"build_images_per_s": 31.5, "query_p50_ms": 12.25,
                                                       "query_p99_ms": 40.0, "n_images": 100000})])
    assert "31.5 images/s" in full and "100,000 images: p50 12.2 ms, p99 40.0 ms" in full


def test_each_card_says_what_was_chosen_on_its_val_data_and_among_how_many():
    e = pretrained.entries()[0]
    assert "Chosen on" not in "\n".join(card.card(dataclasses.replace(e, selected=[])))
    text = "\n".join(card.card(dataclasses.replace(e, selected=[
        {"what": "the epoch", "among": 6, "by": "val rsum", "cross_fitted": False},
        {"what": "the weight", "among": ["run_a", "run_b", "run_c"], "by": "pointing", "cross_fitted": True}])))
    assert ("Chosen on the same Flickr8k val as the figures above (so they overstate what new data would give): "
            "the epoch (best of 6 by val rsum).") in text
    assert ("Chosen on one half of val and reported on the other (cross-fitted): the weight (best of 3 by pointing: "
            "`run_a`, `run_b`, `run_c`).") in text
    for shipped in pretrained.entries():  # every shipped model says at least which epoch it is
        assert shipped.selected and shipped.selected[0]["what"] == "the epoch"


def test_update_rewrites_only_the_block_and_refuses_a_file_without_markers(tmp_path):
    f = tmp_path / "page.md"
    f.write_text(f"# title\n\nbefore\n{card.BEGIN}\nstale\n{card.END}\nafter\n")
    assert card.update(f, "fresh\n")
    assert f.read_text() == f"# title\n\nbefore\n{card.BEGIN}\nfresh\n{card.END}\nafter\n"
    assert not card.update(f, "fresh\n")
    g = tmp_path / "plain.md"
    g.write_text("no markers\n")
    with pytest.raises(DataError, match="plain.md.*block"):
        card.update(g)


@pytest.mark.parametrize("doc,begin,end,render", [
    ("README.md", card.SUMMARY_BEGIN, card.SUMMARY_END, card.summary),
    ("docs/pretrained.md", card.BEGIN, card.END, card.render),
    ("docs/search.md", card.CALIBRATION_BEGIN, card.CALIBRATION_END, card.default_calibration)])
def test_the_committed_card_is_the_registry_rendered(doc, begin, end, render):
    """Run `python release/ship.py --card` after changing the registry."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert begin in text and end in text, f"{doc} has no model card block"
    block = text[text.index(begin) + len(begin):text.index(end)]
    assert block == "\n" + render(), f"{doc}'s model card is stale: run `python release/ship.py --card`"
