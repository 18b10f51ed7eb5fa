"""benchmarks/harness.py, the one harness of the speed benchmarks: timing with a warm-up and repeats, the ratio to a
bound, and a result's JSON record written together with its Markdown rendering (the host record: tests/lab/)."""

import json

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def harness():
    return load_script("harness")


def test_a_report_is_its_json_and_its_rendering(harness, tmp_path):
    harness.write_report(tmp_path / "bench", {"ms": 1.5}, lambda r: f"| ms |\n|---|\n| {r['ms']} |\n")
    assert json.loads((tmp_path / "bench.json").read_text()) == {"ms": 1.5}
    assert (tmp_path / "bench.md").read_text().endswith("| 1.5 |\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]  # no temporary left


def test_timing_warms_up_untimed_then_reports_min_median_max_of_the_repeats(harness, monkeypatch):
    calls, clock = [], iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])  # timed calls of 1 s, 3 s and 2 s

    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(clock))
    t = harness.timed(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5  # two warm-up calls that read no clock, then three timed ones
    assert (t["min_s"], t["median_s"], t["max_s"], t["times_s"]) == (1.0, 2.0, 3.0, [1.0, 3.0, 2.0])
    with pytest.raises(ValueError, match="repeats"):
        harness.timed(lambda: None, repeats=0)


def test_the_ratio_to_the_bound(harness):
    assert harness.ratio_to_bound(3.0, 1.5) == 2.0
    with pytest.raises(ValueError, match="bound"):
        harness.ratio_to_bound(1.0, 0.0)
