"""release/check.py (``release/ship.py --check``): every figure the registry of shipped models quotes equals the
results file it was copied from -- the val recalls (experiments/results/shipped/NAME.json, the training run's row
experiments/results/flickr8k/RUN.json or the grounding run's record), the calibration's beta, banks and held-out
figures (experiments/results/calibration/RUN.json, the shipped calibration.json), the explainer's pointing figures
and reading (experiments/results/grounding/ROW.json), the default pair's search figures
(benchmarks/results/search.json), the duplicates limits (benchmarks/results/duplicates_copies.json) and the
open-vocabulary fusion (experiments/results/open_vocab/). A figure edited by hand, or a results file re-run without
shipping again, fails."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from tests.benchmark_scripts import RELEASE, load_script
from vlmatch import pretrained

ENTRIES = pretrained.entries()


@pytest.fixture(scope="module")
def check():
    with pytest.MonkeyPatch.context() as mp:  # the prose check reads release/figures.py, beside it
        mp.syspath_prepend(str(RELEASE))
        yield load_script("check", "release_check")


def test_there_are_entries_to_check():
    assert len(ENTRIES) >= 5 and sum(bool(e.calibration) for e in ENTRIES) >= 2 and any(e.explainer for e in ENTRIES)
    assert sum(e.default for e in ENTRIES) >= 1


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_figure_of_the_registry_is_its_results_file(check, entry):
    assert check.entry_problems(entry) == []


@pytest.mark.parametrize("change, says", [
    (lambda e: {"val": {**e.val, "float32": {**e.val["float32"], "rsum": e.val["float32"]["rsum"] + 0.1}}}, "val rsum"),
    (lambda e: {"val_rsum": e.val_rsum + 1}, "val_rsum"),
    (lambda e: {"explainer": {**e.explainer, "pointing": e.explainer["pointing"] + 1}}, "explainer pointing"),
    (lambda e: {"search": {**e.search, "query_p50_ms": 0.1}}, "search query_p50_ms"),
])
def test_a_figure_edited_by_hand_is_named(check, change, says):
    entry = next(e for e in ENTRIES if e.default and e.explainer and e.search)
    edited = dataclasses.replace(entry, **change(entry))
    found = check.check_registry([edited])
    assert found and all(p.startswith(f"{entry.name}: ") for p in found) and any(says in p for p in found), found


def test_a_calibration_record_rerun_without_shipping_again_is_named(check, tmp_path):
    entry = next(e for e in ENTRIES if e.calibration)
    shutil.copytree(check.EXPERIMENTS, tmp_path / "results")
    run = entry.calibration["command"].split("--model ", 1)[1].split()[0]
    path = tmp_path / "results" / "calibration" / f"{run}.json"
    path.write_text(path.read_text().replace(f'"beta": {entry.calibration["beta"]}', '"beta": 99.0'))
    found = check.check_registry([entry], experiments=tmp_path / "results")
    assert any("calibration beta" in p for p in found), found


def test_ship_check_prints_each_problem_and_fails(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(RELEASE))
    ship = load_script("ship", "release_ship")
    assert ship.main(["--check"]) == 0 and "every figure" in capsys.readouterr().out
    edited = [dataclasses.replace(e, val_rsum=e.val_rsum + 1) if e.default else e for e in ENTRIES]
    monkeypatch.setattr(pretrained, "entries", lambda: edited)
    assert ship.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "val_rsum" in out and out.count("\n") >= 1


FIGURE_FIELDS = ("val_rsum", "val", "calibration", "explainer", "search", "ms_per_query", "duplicates", "open_vocab",
                 "selected")


def _figures(obj, path=()):
    """Every number (and yes/no flag) under a registry field, as a path of keys."""
    if isinstance(obj, bool | int | float):
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _figures(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _figures(v, (*path, i))


def _nudged(v):
    """``v`` moved by one step of its last printed digit (0.095 -> 0.096, 350.76 -> 350.77, 1e-05 -> 2e-05, 3 -> 4;
    a flag flipped): the smallest hand edit that changes what a reader sees."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    text = repr(v)
    if "e" in text:
        mantissa, exp = text.split("e")
        step = 10.0 ** (int(exp) - (len(mantissa.split(".")[1]) if "." in mantissa else 0))
    else:
        step = 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
    return v + step


def _changed(obj, path):
    if not path:
        return _nudged(obj)
    out = dict(obj) if isinstance(obj, dict) else list(obj)
    out[path[0]] = _changed(obj[path[0]], path[1:])
    return out


@pytest.mark.slow  # the whole registry checked once per figure (400+ checks)
def test_every_figure_of_the_registry_changed_by_hand_is_named(check):
    """The whole registry, one figure at a time: each number (and flag) of every entry's figures, moved by one step
    of its last printed digit, makes `release/ship.py --check` name that entry and the changed field -- no figure
    travels unchecked, and no tolerance hides a hand edit of a copied figure."""
    tried, missed = 0, []
    for entry in ENTRIES:
        for name in FIGURE_FIELDS:
            value = getattr(entry, name)
            if value is None:
                continue
            for path in _figures(value):
                tried += 1
                found = check.check_registry([dataclasses.replace(entry, **{name: _changed(value, path)})])
                keys = [name, *(k for k in path if isinstance(k, str))]
                if not any(p.startswith(f"{entry.name}: ") and any(k in p for k in keys[1:] or keys) for p in found):
                    missed.append(f"{entry.name}.{name}" + "".join(f"[{k!r}]" for k in path) + f": {found}")
    assert tried > 400 and not missed, missed[:10]


@pytest.mark.parametrize("field", ["notes", "explainer.selection"])
def test_a_figure_in_the_registrys_prose_that_no_result_holds_is_named(check, field):
    entry = next(e for e in ENTRIES if e.explainer and e.explainer.get("selection") and e.notes)
    if field == "notes":
        changed = dataclasses.replace(entry, notes=entry.notes + " It points 91.37 % of the time.")
    else:
        changed = dataclasses.replace(entry, explainer={**entry.explainer,
                                                        "selection": entry.explainer["selection"] + " (+ 4.41)"})
    found = check.entry_problems(changed)
    assert any(field in p and ("91.37 %" in p or "4.41" in p) for p in found), found


def test_notes_that_differ_from_the_recipes_are_named(check):
    entry = next(e for e in ENTRIES if e.notes)
    found = check.entry_problems(dataclasses.replace(entry, notes=entry.notes.replace("Flickr8k", "Flickr30k", 1)))
    assert any("recipe.ship.notes" in p for p in found), found


def test_a_candidate_run_without_results_row_or_a_count_typed_by_hand_is_named(check):
    entry = next(e for e in ENTRIES if any(isinstance(c["among"], list) for c in e.selected))
    i = next(i for i, c in enumerate(entry.selected) if isinstance(c["among"], list))
    unmeasured = [{**c, "among": [*c["among"], "never_run"]} if j == i else c for j, c in enumerate(entry.selected)]
    found = check.entry_problems(dataclasses.replace(entry, selected=unmeasured))
    assert any("selected" in p for p in found), found
    declared = [c for c in entry.selected if isinstance(c["among"], list)]
    assert check.selection_record(entry, declared=[{**declared[0], "among": [*declared[0]["among"], "never_run"]}])
    assert any("never_run has no results row" in p for p in check.selection_problems(
        dataclasses.replace(entry, selected=check.selection_record(
            entry, declared=[{**declared[0], "among": [*declared[0]["among"], "never_run"]}]))))


def test_a_choice_said_to_be_by_val_rsum_that_a_candidate_beats_is_named(check, monkeypatch):
    entry = next(e for e in ENTRIES if e.name == "vsepp-minilm-f8k")  # c22_vsepp_minilm_decay: 297.0 val rsum
    claim = {"what": "the seed", "among": ["c22_vsepp_minilm_decay", "c22_vsepp_minilm_decay_s1"], "by": "val rsum"}
    monkeypatch.setattr(check, "_recipe_ship", lambda name: {"selected": [claim]})
    selected = check.selection_record(entry)
    found = check.selection_problems(dataclasses.replace(entry, selected=selected))
    assert any("c22_vsepp_minilm_decay_s1" in p and "beats its own run" in p for p in found), found


def test_a_cross_fitted_choice_reads_its_candidates_from_its_record(check):
    entry = next(e for e in ENTRIES if e.default)
    weight = next(c for c in check.selection_record(entry) if c["what"] == "the grounding weight")
    assert weight["cross_fitted"] and len(weight["among"]) == 2 and "at least 337" in weight["by"]


def test_ship_check_names_a_recipe_it_cannot_read_in_one_line(capsys, monkeypatch):
    from vlmatch.errors import DataError

    monkeypatch.syspath_prepend(str(RELEASE))
    ship = load_script("ship", "release_ship_bad_recipe")
    check = __import__("check")

    def unreadable(name):
        raise DataError(f"experiments/recipes/pretrained/{name}.yaml", "recipe.ship.selected: each choice is ...")

    monkeypatch.setattr(check, "_recipe_ship", unreadable)
    assert ship.main(["--check"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and ".yaml" in out and "recipe.ship.selected" in out


def test_the_checkout_as_it_is_has_no_behaviour_card_or_checkout_problem(check):
    assert check.check_checkout() == []


@pytest.mark.parametrize("change, says", [
    (lambda e: {"features": {**e.features, "input_size": 448}}, "features.input_size"),
    (lambda e: {"features": {**e.features, "normalisation": "(pixel - 128) / 128"}}, "features.normalisation"),
    (lambda e: {"open_vocab": {**e.open_vocab, "words": "flickr30k-train"}}, "open_vocab.words"),
    (lambda e: {"licence": e.licence.replace("research use", "any use")}, "licence"),
    (lambda e: {"data": e.data.replace("6,000", "8,000")}, "data"),
    (lambda e: {"default": False}, "default"),
    (lambda e: {"role": "rescorer"}, "role"),
    (lambda e: {"config": {**e.config, "embed_dim": 512}}, "config.embed_dim"),
])
def test_a_field_that_changes_behaviour_edited_by_hand_is_named(check, change, says):
    entry = next(e for e in ENTRIES if e.default and e.open_vocab)
    found = check.behaviour_problems(dataclasses.replace(entry, **change(entry)))
    assert any(p.startswith(says) for p in found), found


def test_a_generated_block_the_registry_no_longer_renders_is_named(check, monkeypatch):
    from vlmatch.pretrained import card

    edited = [dataclasses.replace(e, val_rsum=e.val_rsum + 0.1) if e.default else e for e in ENTRIES]
    monkeypatch.setattr(card, "entries", lambda: edited)
    found = check.card_problems()
    assert any(p.startswith("README.md: its summary block") for p in found), found
    assert any(p.startswith("docs/pretrained.md: its card block") for p in found), found


def test_a_package_read_from_another_checkout_is_named(check, monkeypatch, tmp_path):
    import vlmatch

    monkeypatch.setattr(vlmatch, "__file__", str(tmp_path / "elsewhere" / "vlmatch" / "__init__.py"))
    found = check.check_checkout()
    assert len(found) == 1 and "not this checkout's" in found[0], found
