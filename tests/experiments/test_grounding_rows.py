"""The grounding rows' files (experiments/results/grounding/ROW.json): one JSON object, one top-level key a line and
one line per image of the per-image counts. A row reads back exactly as it was written, every committed row is in
that form, and the pages built from the rows (grounding.md, the seed page, flickr8k.md's pointing column) are the
committed pages."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import BENCHMARKS, EXPERIMENTS, load_script

RESULTS = EXPERIMENTS / "results"
ROW_FILES = sorted((RESULTS / "grounding").glob("*.json")) + sorted((RESULTS / "grounding_train_split").glob("*.json"))


@pytest.fixture(scope="module")
def grounding():
    return load_script("grounding", "grounding_rows")


def _row():
    return {"row": "tiny", "model": "pretrained:x", "val_rsum": 338.72, "note": None, "pointing": 71.66,
            "host": {"cpu": "AMD EPYC", "flags": ["avx2", "avx512f"]}, "phrases": 7, "seconds": 1e-05,
            "by_type": {"people": {"pointing": 60.0, "phrases": 5}, "other": {"pointing": 100.0, "phrases": 2}},
            "per_image": {"names": ["a.jpg", "b \"c\".jpg", "é.jpg"], "hits": [3, 0, 2], "phrases": [4, 1, 2]},
            "pointing_ci95": [70.33, 73.02]}


def test_a_row_reads_back_as_written_one_image_a_line(grounding, tmp_path):
    path = tmp_path / "rows" / "tiny.json"
    grounding.write_row(path, _row())
    assert [p.name for p in path.parent.iterdir()] == ["tiny.json"]  # the temporary file was renamed onto it
    back = grounding.read_row(path)
    assert back == _row() and list(back) == list(_row()) and json.dumps(back) == json.dumps(_row())
    lines = path.read_text().splitlines()
    assert len(lines) == 2 + len(_row()) + 3 + 1  # braces, a line a key, the three images and the rows' close
    assert lines[lines.index(' "per_image": {"columns": ["names", "hits", "phrases"], "rows": [') + 1] == '  ["a.jpg", 3, 4],'
    summary = json.loads(path.read_text())  # plain JSON: a reader of the summary figures needs nothing more
    assert summary["pointing"] == 71.66 and summary["per_image"]["rows"][2] == ["\u00e9.jpg", 2, 2]


def test_a_row_without_images_or_per_image_counts_reads_back(grounding, tmp_path):
    for row in ({**_row(), "per_image": {"names": [], "hits": [], "phrases": []}},
                {k: v for k, v in _row().items() if k != "per_image"}):
        grounding.write_row(tmp_path / "r.json", row)
        assert grounding.read_row(tmp_path / "r.json") == row


def test_per_image_columns_of_different_lengths_are_refused(grounding, tmp_path):
    row = {**_row(), "per_image": {"names": ["a.jpg"], "hits": [1, 2], "phrases": [1]}}
    with pytest.raises(ValueError, match="different lengths"):
        grounding.write_row(tmp_path / "r.json", row)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("path", ROW_FILES, ids=lambda p: p.stem)
def test_every_committed_row_is_in_the_compact_form(grounding, path):
    row = grounding.read_row(path)
    assert grounding.row_text(row) == path.read_text(encoding="utf-8")
    per = row.get("per_image")
    if per:
        assert len(per["names"]) == len(per["hits"]) == len(per["phrases"]) == row["images"]
        assert sum(per["phrases"]) == row["phrases"]


def test_the_pages_built_from_the_rows_are_the_committed_pages(grounding):
    rows = grounding.load_rows()
    assert len(rows) == len(list((RESULTS / "grounding").glob("*.json")))
    assert grounding.render(rows) == (RESULTS / "grounding.md").read_text(encoding="utf-8")
    assert grounding.render_seed_page(rows) == (BENCHMARKS / "results" / "grounding.md").read_text(encoding="utf-8")
    flickr8k = load_script("flickr8k", "flickr8k_rows")  # its pointing column reads the rows' summary figures
    assert flickr8k.render(flickr8k.load_results()) == (RESULTS / "flickr8k.md").read_text(encoding="utf-8")
