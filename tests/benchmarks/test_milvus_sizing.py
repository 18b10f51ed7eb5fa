"""benchmarks/milvus_sizing.py: the sizing of docs/milvus.md is computed from the layout, and the page's block is
what the inputs give (a figure edited by hand in it fails)."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def sizing():
    return load_script("milvus_sizing", "milvus_sizing_under_test")


def test_per_photo_bytes_follow_the_layout(sizing):
    p = sizing.compute()["per_photo_bytes"]
    assert p["stage1"] == 1024 * 4 and p["stage2_default"] == 1024 * 2 and p["hnsw_graph"] == 2 * 32 * 4
    assert sorted(p["stage2_cells"].values()) == [7 * 7 * 512 * 2, 14 * 14 * 512 * 2]
    assert p["ivf_pq"] == 64 + 8 and p["diskann_memory"] == 4096 / 8


def test_totals_scale_with_photos_and_nodes_hold_the_memory(sizing):
    r = sizing.compute()
    ten, hundred = r["at"]["10000000"], r["at"]["100000000"]
    assert hundred["stage2_default"] == 10 * ten["stage2_default"]
    usable = sizing.INPUTS["node_memory_gb"] * 1e9 * sizing.INPUTS["node_usable_share"]
    for a in (ten, hundred):
        n = a["query_nodes_per_replica"]
        assert (n - 1) * usable < a["memory_per_replica"] <= n * usable


def test_size_reads_in_decimal_units(sizing):
    assert [sizing.size(b) for b in (512, 2048, 2.05e10, 5.02e12)] == ["512 B", "2.0 KB", "20 GB", "5.0 TB"]


def test_the_docs_block_is_what_the_inputs_give(sizing, monkeypatch, tmp_path):
    assert sizing.main(["--check"]) == 0
    page = tmp_path / "milvus.md"
    page.write_text(sizing.PAGE.read_text().replace("| 44 GB |", "| 45 GB |", 1))
    monkeypatch.setattr(sizing, "PAGE", page)
    assert sizing.main(["--check"]) == 1
