"""release/figure_sources.py: each figure the README and the docs quote is tied to one results file and key
(release/figure_sources.json) and must be that value as written; a neighbouring real figure (another seed's, the
uncalibrated one, the photo alone) is named although a linked results file holds it too."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import RELEASE, load_script


@pytest.fixture(scope="module")
def src():
    with pytest.MonkeyPatch.context() as mp:  # it imports release/figures.py, beside it
        mp.syspath_prepend(str(RELEASE))
        yield load_script("figure_sources", "release_figure_sources")


def test_every_figure_of_the_readme_and_docs_is_its_one_sources_value(src):
    table = src.read_table()
    assert sum(len(v) for v in table.values()) >= 500
    found = src.problems(table)
    assert found == [], "\n".join(found[:20])


# (page, the figure as the page writes it with the words before it, a neighbouring real figure of its results)
NEIGHBOURS = [
    ("README.md", "the named thing for 76.8 %", "76.4 %"),  # the second seed's mirror pointing
    ("README.md", "the named thing for 76.8 %", "71.7 %"),  # the photo alone
    ("README.md", "`pretrained:vsepp-lite2-320-grounded-f8k` | 350.8", "338.7"),  # uncalibrated
    ("README.md", "`--model pretrained:vsepp-lite2-448-lora-f8k` | 360.8", "350.8"),  # another model's
    ("docs/search.md", "320 px: 350.8", "338.7"),  # the uncalibrated figure
    ("docs/search.md", "320 px: 350.8", "342.7"),  # the second seed's, calibrated
    ("docs/search.md", "320 px: 350.8", "350.7"),  # one step
    ("docs/search.md", "named thing for 76.8 %", "76.4 %"),
]


@pytest.mark.parametrize("rel, written, neighbour", NEIGHBOURS)
def test_a_neighbouring_real_figure_is_named(src, rel, written, neighbour):
    page = src.ROOT / rel
    text = page.read_text(encoding="utf-8")
    old = src.F.FIGURE.findall(written)[-1]
    figure = old[0] + old[1]
    assert text.count(written) == 1, written
    edited = text.replace(written, written[: written.rindex(figure)] + neighbour)
    if neighbour != "350.7":  # a real figure: the rule of any linked number let it through
        assert src.F.sourced(neighbour, src.F.page_values(page))
    found = src.page_problems(page, text=edited)
    assert len(found) == 1 and found[0].startswith(f"{rel}:") and f" {neighbour} is not " in found[0], found


def _site(tmp_path, src, monkeypatch, prose: str):
    F = src.F
    docs, results = tmp_path / "docs", tmp_path / "experiments" / "results"
    (docs / "results").mkdir(parents=True)
    results.mkdir(parents=True)
    (results / "study.md").write_text("| run | rsum |\n|---|---:|\n| a | 346.91 |\n| b | 339.62 |\n")
    (results / "study.json").write_text(json.dumps({"runs": [{"name": "a", "rsum": 346.91, "pointing": 0.7553},
                                                             {"name": "b", "rsum": 339.62, "pointing": 0.7412}]}))
    (results / "study.csv").write_text("run,rsum\na,346.91\nb,339.62\n")
    (docs / "results" / "study.md").write_text('--8<-- "experiments/results/study.md"\n')
    page = docs / "guide.md"
    page.write_text(prose)
    for name, value in (("ROOT", tmp_path), ("DOCS", docs), ("RESULT_ROOTS", (results,)), ("GENERATED", ())):
        monkeypatch.setattr(F, name, value)
    monkeypatch.setattr(src, "ROOT", tmp_path)
    (tmp_path / "README.md").write_text("Nothing measured here.\n")
    for f in (F.file_values, src.keyed_values, src.linked, src._link_spans):
        f.cache_clear()
    return page


PROSE = "Run a ranks 346.9 and points 75.5 % ([results](results/study.md)).\n"


def test_keys_name_list_items_by_name_and_csv_rows_by_their_first_cell(src, tmp_path, monkeypatch):
    _site(tmp_path, src, monkeypatch, PROSE)
    res = tmp_path / "experiments" / "results"
    assert src.keyed_values(res / "study.json")["runs[b].rsum"] == 339.62
    assert src.keyed_values(res / "study.csv")["a.rsum"] == 346.91
    assert src.source_value(res / "study.md", "| b | ") == 339.62


def test_bind_ties_each_figure_and_the_check_then_holds_it_to_that_key(src, tmp_path, monkeypatch):
    page = _site(tmp_path, src, monkeypatch, PROSE)
    table, said = src.bind({})
    ties = table["docs/guide.md"]
    # 346.9 is held by two files (the JSON and the CSV): chosen among 2, said so for a reader to confirm
    assert ties[0]["among"] == 2 and ties[0]["source"].endswith(("#runs[a].rsum", "#a.rsum")) and len(said) == 2
    assert ties[1]["source"] == "experiments/results/study.json#runs[a].pointing" and "among" not in ties[1]
    assert src.problems(table) == []
    ties[0] = {"at": ties[0]["at"], "source": "experiments/results/study.json#runs[a].rsum"}  # confirmed by hand
    # the other run's figure, which the same results hold, is named now
    page.write_text(PROSE.replace("346.9", "339.6"))
    assert src.problems(table) == ["docs/guide.md:1: 339.6 is not experiments/results/study.json#runs[a].rsum "
                                   "(346.91)"]


def test_an_untied_figure_a_stale_tie_a_lost_key_and_an_unlinked_file_are_named(src, tmp_path, monkeypatch):
    _site(tmp_path, src, monkeypatch, PROSE)
    table, _ = src.bind({})
    untied = {"docs/guide.md": table["docs/guide.md"][:1]}
    assert [p.split(": ", 1)[1][:31] for p in src.problems(untied)] == ["75.5 % is tied to no source (af"]
    stale = {"docs/guide.md": [*table["docs/guide.md"], {"at": "gone words", "source": "x.json#a"}]}
    assert any("names no figure on the page" in p for p in src.problems(stale))
    lost = {"docs/guide.md": [{**table["docs/guide.md"][0], "source": "experiments/results/study.json#runs[c].rsum"},
                              table["docs/guide.md"][1]]}
    assert src.problems(lost) == ["docs/guide.md:1: 346.9: its source experiments/results/study.json holds no "
                                  "runs[c].rsum"]
    (tmp_path / "other.json").write_text('{"rsum": 346.9}')
    unlinked = {"docs/guide.md": [{**table["docs/guide.md"][0], "source": "other.json#rsum"},
                                  table["docs/guide.md"][1]]}
    assert src.problems(unlinked) == ["docs/guide.md:1: 346.9: its source other.json is not a results file the page "
                                      "links to"]


def test_a_tie_is_found_by_the_words_before_its_figure_with_other_figures_as_hashes(src):
    prose = "it read 329.0 to 331.2 on three hosts"
    assert src.context(prose, prose.index("331.2")) == "it read # to"
