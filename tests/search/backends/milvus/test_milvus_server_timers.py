"""The test server's short timers reach its config template, and a benchmark's server keeps the defaults
(no server is started here)."""

import pytest

from vlmatch_lab.milvus_server import MilvusTestServer, why_not

if why_not():
    pytest.skip(why_not(), allow_module_level=True)


def _keys(text: str) -> set[str]:
    """Dotted keys of a YAML text's plain ``key: value`` lines (enough for Milvus's template)."""
    out, path = set(), []
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped.strip() or ":" not in stripped or stripped.lstrip().startswith("-"):
            continue
        level = (len(stripped) - len(stripped.lstrip())) // 2
        key = stripped.strip().split(":", 1)[0]
        path = path[:level] + [key]
        out.add(".".join(path))
    return out


def test_the_test_servers_template_has_the_short_timers_and_a_benchmarks_has_none(tmp_path):
    fast = _keys(MilvusTestServer(tmp_path / "a")._template().read_text())
    plain = _keys(MilvusTestServer(tmp_path / "b", test_timers=False)._template().read_text())
    added = {"dataCoord.compaction.check.interval", "queryCoord.checkChannelInterval",
             "queryCoord.checkSegmentInterval"}
    assert added <= fast
    assert not added & plain
    assert "dataCoord.compaction.enableAutoCompaction" in plain  # the parser found the section it looked in
