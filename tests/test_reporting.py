"""benchmarks/reporting.py: a benchmark's JSON record and its Markdown rendering are written together."""

import json

from tests.benchmark_scripts import load_script


def test_a_report_is_its_json_and_its_rendering(tmp_path):
    reporting = load_script("reporting")
    reporting.write_report(tmp_path / "bench", {"ms": 1.5}, lambda r: f"| ms |\n|---|\n| {r['ms']} |\n")
    assert json.loads((tmp_path / "bench.json").read_text()) == {"ms": 1.5}
    assert (tmp_path / "bench.md").read_text().endswith("| 1.5 |\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]  # no temporary left
