"""benchmarks/cold_start.py's pure parts: the VLMATCH_PROFILE line it reads, and its table."""

from tests.benchmark_scripts import load_script


def test_the_profile_line_is_read_and_the_table_shows_each_label():
    bench = load_script("cold_start")
    line = "noise\nvlmatch: profile: import 0.930 s, load 0.380 s, encode 0.020 s, search 0.004 s, total 1.450 s\n"
    assert bench.parse_profile(line) == {"import": 0.93, "load": 0.38, "encode": 0.02, "search": 0.004, "total": 1.45}
    assert bench.parse_profile("vlmatch: error: x\n") == {}
    cmd = {"median_s": 1.5, "min_s": 1.4, "max_s": 1.6, "split_s": {"startup": 0.1, "import": 0.9}}
    rep = {"host": {"cpu": "cpu", "cores": 2}, "issue_before": bench.ISSUE_BEFORE,
           "labels": {"before": {"when": "t", "src": "s", "note": "n", "commands": {"search": {**cmd, "split_s": {}}}},
                      "after": {"when": "t", "src": "s", "rev": "abc", "note": "n", "commands": {"search": cmd}}}}
    text = bench.render(rep)
    assert "| before | search | 1.50 | 1.40 | 1.60 | 2.0 | - |" in text
    assert "| after | search | 1.50 | 1.40 | 1.60 | 2.0 | startup 0.10, import 0.90 |" in text
    assert "vlmatch abc" in text and "help 1.99 s, search 6.13 s" in text
