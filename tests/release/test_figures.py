"""release/figures.py: every figure the README and the docs quote in prose is held by a results file the page links
to; code, generated blocks, comments and versions are not prose; a figure no linked result holds is named."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def fig():
    return load_script("figures", "release_figures")


def test_every_page_quotes_only_figures_its_linked_results_hold(fig):
    pages = fig.pages()
    assert len(pages) >= 20 and any(p.name == "README.md" for p in pages)
    found = [line for page in pages for line in fig.unsourced(page)]
    assert found == [], "\n".join(found[:20])


def test_code_generated_blocks_comments_and_versions_are_not_prose(fig):
    text = ("Python 3.11 or newer.\n```bash\nvlmatch --lr 0.25\n```\n`margin 0.2` and\n<!-- x:begin -->\n| 350.8 |\n"
            "<!-- x:end -->\n<!-- 12.5 -->\nit reads 76.8 % [here](results/a.md#b-1.5)\n")
    assert fig.figures(text) == [(10, "76.8 %")]  # the line number of the page, code and blocks blanked


def test_figures_are_decimals_and_percentages_not_counts(fig):
    assert fig.figures("1,000 photos, 5 captions, 12 % of them, 0.35 s, R@10 of 72.9, 3x faster") == [
        (1, "12 %"), (1, "0.35"), (1, "72.9")]


def test_both_ends_of_a_range_and_signed_differences_are_figures(fig):
    assert fig.figures("interval 70.3-73.0, a cost of -0.9 rsum, 1,056.5 s, +5.2 %") == [
        (1, "70.3"), (1, "73.0"), (1, "0.9"), (1, "1,056.5"), (1, "5.2 %")]


@pytest.mark.parametrize("figure, values, ok", [
    ("76.8", {76.78}, True), ("76.8", {76.74}, False), ("75.5 %", {0.755}, True), ("75.5 %", {0.754}, False),
    ("0.095", {0.095}, True), ("350.8", {350.75}, True), ("350.8", {350.85}, False)])
def test_a_figure_is_sourced_when_a_value_rounds_to_it(fig, figure, values, ok):
    assert fig.sourced(figure, values) is ok


def _site(tmp_path, fig, monkeypatch, prose: str):
    docs, results = tmp_path / "docs", tmp_path / "experiments" / "results"
    (docs / "results").mkdir(parents=True)
    results.mkdir(parents=True)
    (results / "study.md").write_text("| run | rsum |\n|---|---:|\n| a | 346.91 |\n")
    (results / "study.json").write_text('{"pointing": 0.7553, "rsum": 346.91}')
    (docs / "results" / "study.md").write_text('--8<-- "experiments/results/study.md"\n')
    page = docs / "guide.md"
    page.write_text(prose)
    for name, value in (("ROOT", tmp_path), ("DOCS", docs), ("RESULT_ROOTS", (results,)), ("GENERATED", ())):
        monkeypatch.setattr(fig, name, value)
    fig.file_values.cache_clear()
    return page


def test_a_figure_the_linked_results_hold_passes_and_one_they_do_not_is_named(fig, tmp_path, monkeypatch):
    page = _site(tmp_path, fig, monkeypatch, "It ranks 346.9 and points 75.5 % ([results](results/study.md)).\n")
    assert fig.unsourced(page) == []
    page.write_text("It ranks 346.9 and points 75.5 % ([results](results/study.md)); the old model read 339.6.\n")
    assert fig.unsourced(page) == ["docs/guide.md:1: 339.6 is in no results file the page links to"]


def test_a_page_that_links_no_results_has_no_sources(fig, tmp_path, monkeypatch):
    page = _site(tmp_path, fig, monkeypatch, "It ranks 346.9.\n")
    assert len(fig.unsourced(page)) == 1


@pytest.mark.parametrize("edit", ["346.8", "347.0", "75.4 %", "75.6 %"])
def test_a_figure_moved_by_one_step_of_its_last_digit_is_named(fig, tmp_path, monkeypatch, edit):
    prose = "It ranks 346.9 and points 75.5 % ([results](results/study.md)).\n"
    original = "346.9" if "%" not in edit else "75.5 %"
    page = _site(tmp_path, fig, monkeypatch, prose.replace(original, edit))
    assert [line.split(": ")[1] for line in fig.unsourced(page)] == [edit + " is in no results file the page links to"]


def test_the_command_exits_1_on_a_problem(fig, tmp_path, monkeypatch, capsys):
    _site(tmp_path, fig, monkeypatch, "It read 339.6 ([results](results/study.md)).\n")
    (tmp_path / "README.md").write_text("Nothing measured here.\n")
    assert fig.main([]) == 1 and "339.6" in capsys.readouterr().out
