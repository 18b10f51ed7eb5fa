"""experiments/flickr8k.py's report: the noise figure comes from repeats of one setting, and each ablation
claim is judged against it (a difference inside the noise decides nothing)."""

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def report():
    return load_script("flickr8k", "flickr8k_report")


def _run(rsum, seed=0, threads=1, lr=1e-3, patience=3, history=None):
    return {"metrics": {"rsum": rsum, "i2t_r1": 0.0, "t2i_r1": 0.0, "epoch": 0}, "epochs": 10, "minutes_per_epoch": 1.0,
            "val_rsum_by_epoch": history if history is not None else [rsum],
            "config": {"model": {"name": "caan"}, "data": {"path": "x"},
                       "train": {"lr": lr, "seed": seed, "threads": threads, "patience": patience}}}


def test_the_noise_is_the_largest_spread_among_repeats_of_one_setting(report):
    runs = {"a": _run(290.0), "a_s1": _run(293.0, seed=1), "a_2t": _run(291.0, threads=2),
            "b": _run(280.0, lr=5e-4), "b_s1": _run(281.0, lr=5e-4, seed=1), "c": _run(250.0, lr=2e-4)}
    assert report.noise(runs) == pytest.approx(3.0)
    assert report.noise({"c": _run(250.0)}) is None
    # a re-ranked row shares its base run's config, but it is no repeat of it
    runs["a_rr"] = {**_run(330.0), "rerank": {"k": 15}}
    assert report.noise(runs) == pytest.approx(3.0)
    # where the allocator put memory changes nothing computed: a run recorded with the option is a repeat
    # of one recorded before it existed
    runs["a_mem"] = _run(295.0, seed=2)
    runs["a_mem"]["config"]["train"]["reuse_freed_memory"] = True
    assert report.noise(runs) == pytest.approx(5.0)


def test_an_option_added_after_a_run_was_recorded_reads_as_its_default(report):
    old, new = _run(290.0), _run(296.0, seed=1)
    new["config"]["train"]["pretrained_lr_scale"] = 1.0  # the default: the old run trained as this
    assert report.noise({"old": old, "new": new}) == pytest.approx(6.0)
    new["config"]["train"]["pretrained_lr_scale"] = 0.3  # another value: another setting
    assert report.noise({"old": old, "new": new}) is None


@pytest.mark.parametrize("diff, expected", [(3.1, "holds"), (2.9, "within the noise"), (-2.9, "within the noise"),
                                            (-3.1, "reversed")])
def test_a_claim_holds_only_beyond_the_noise(report, diff, expected):
    assert report.verdict(diff, 3.0) == expected


def test_the_claims_table_gives_each_claims_runs_or_says_which_are_missing(report):
    runs = {"c22_caan": _run(290.0, history=[250.0, 280.0, 270.0, 275.0, 290.0]), "c22_caan_baseline": _run(270.0),
            "c23_caan_inner": _run(279.0, history=[260.0, 270.0, 279.0, 275.0]),
            "c23_sman_sum": _run(300.0, history=[200.0, 300.0]), "c23_sman_per_level": _run(310.0, history=[310.0] * 4)}
    table = "\n".join(report.claims_table(runs, 2.5))
    assert "| each to convergence | c22_caan (290.0) | c22_caan_baseline (270.0) | +20.0 | holds |" in table
    # at equal budget: c22_caan's best within its first 4 epochs (280.0), not its best of all (290.0)
    assert "| first 4 epochs | c22_caan (280.0) | c23_caan_inner (279.0) | +1.0 | within the noise |" in table
    assert "to run: c22_mmca_decay, c22_mmca_a0_decay" in table
    # a run that has not trained as far as the budget counts as missing
    assert "| c23_sman_sum | c23_sman_per_level | - | to run: c23_sman_sum |" in table
    assert "2.5 val rsum" in table


def test_rows_say_the_features_size_and_a_fine_tuned_text_side(report):
    run = _run(300.0)
    assert report._model(run) == "caan" and report._text_encoder(run) == "gru"
    run["config"]["data"]["path"] = "/x/benchmarks/cache/flickr8k-efficientnet-lite0-448"
    run["config"]["model"].update(text_encoder="minilm", finetune=True)
    assert report._model(run) == "caan (448 px)" and report._text_encoder(run) == "minilm, fine-tuned"
    run["config"]["data"]["path"] = "/x/benchmarks/cache/flickr8k-efficientnet-lite2-448"
    assert report._model(run) == "caan (lite2, 448 px)"
    run["config"]["data"]["path"] = "/x/benchmarks/cache/flickr8k-efficientnet-lite2"
    assert report._model(run) == "caan (lite2)"
    assert report.features_dir(448, "efficientnet-lite2").name == "flickr8k-efficientnet-lite2-448"
    assert report.features_dir().name == "flickr8k-efficientnet-lite0"


def test_the_convergence_table_holds_the_studys_fixed_budget_runs_but_not_a_later_stage(report):
    runs = {"c22_a": _run(290.0), "c22_fixed": _run(300.0, patience=0), "c22_fixed_s1": _run(296.0, seed=1, patience=0),
            "s22_sweep": _run(200.0, patience=0), "c22_tt": _run(250.0, patience=0)}
    runs["c22_tt"]["config"]["train"]["stage"] = "text_text"
    table = "\n".join(report.convergence_table(runs))
    assert "| c22_a | caan | gru | 1 (1) | 290.0 |" in table
    assert "| c22_fixed | caan | gru | 1 (1), fixed | 300.0 |" in table
    assert "s22_sweep |" not in table and "c22_tt |" not in table
    # the fixed-budget run and its second seed are a repeat: their spread is the noise figure
    assert "c22_fixed 300.0, c22_fixed_s1 296.0: spread 4.0 val rsum" in table
