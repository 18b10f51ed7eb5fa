"""benchmarks/milvus.py: both shapes build the same photos on both backends and rank them alike; a run keeps
the rows of other sizes and shapes in the results file."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmark_scripts import BENCHMARKS, load_script

pytest.importorskip("milvus_lite")


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    mod = load_script("milvus")
    monkeypatch.setattr(mod, "CACHE", tmp_path / "cache")
    return mod


@pytest.mark.slow  # a folder and a Milvus Lite index of 60 photos
@pytest.mark.parametrize("shape", ["scan-7x7", "global-1024"])
def test_both_backends_return_the_same_photos_for_each_shape(bench, shape):
    row = bench.run_size(60, 6, shape)
    assert row["shape"] == shape and row["same_top10"] == 1.0
    assert row["milvus_lite"]["vector"] == "FLOAT16_PACKED" and row["milvus_lite"]["rows_per_photo"] == 1
    for key in ("folder", "milvus_lite"):
        assert row[key]["query"]["p50_ms"] > 0
        if shape == "global-1024":  # a flat stage 1 over 60 photos: every backend finds the exact ten
            assert row[key]["recall10_vs_exact"] == 1.0


def test_a_run_replaces_only_its_own_rows(bench, tmp_path, monkeypatch):
    out = tmp_path / "milvus"
    old = {"host": "old host", "oom_at": 100000, "command": "x",
           "rows": [{**_row(2000), "shape": "scan-7x7"}, _row(10000)]}  # rows of older runs may lack a shape
    out.with_suffix(".json").write_text(json.dumps(old))
    monkeypatch.setattr(bench, "run_size", lambda n, q, shape, server=None, lite=True: {**_row(n), "shape": shape})
    monkeypatch.setattr(sys, "argv", ["milvus.py", "--sizes", "2000", "--shape", "global-1024", "--out", str(out)])
    bench.main()
    got = json.loads(out.with_suffix(".json").read_text())
    assert [(r["n"], r["shape"]) for r in got["rows"]] == [(2000, "scan-7x7"), (10000, "scan-7x7"), (2000, "global-1024")]
    assert got["rows"][0]["host"] == "old host" and got["oom_at"] == 100000
    assert "global-1024" in got["rows"][2]["command"]
    text = out.with_suffix(".md").read_text()
    assert "| 2,000 | global-1024 | milvus-lite |" in text and "OOM killer" in text and "- old host" in text


def _row(n):
    q = {"p50_ms": 1.0, "p99_ms": 2.0, "stage1": {"p50_ms": 0.5}, "stage2": {"p50_ms": 0.5}}
    return {"n": n, "same_top10": 1.0, "folder": {"stage1": "flat", "build_s": 1.0, "disk_mb": 1.0, "query": q},
            "milvus_lite": {"stage1": "flat", "build_s": 2.0, "disk_mb": 2.0, "query": q, "vector": "FLOAT16_PACKED"}}
