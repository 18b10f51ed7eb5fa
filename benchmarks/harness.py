"""The one harness of the speed benchmarks: timing with a warm-up and repeats (min / median / max), the ratio of a
time to its bound, and the result file pair (JSON + Markdown).

    from harness import timed, ratio_to_bound, write_report   # a script of benchmarks/ (its own folder is on the path)
    from vlmatch_lab.host import host

Figures differ by host: every result records ``vlmatch_lab.host.host()`` (CPU model, vector flags, cores, threads,
torch).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path


def timed(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> dict:
    """Seconds per call of ``fn``: ``warmup`` calls untimed (caches, lazy init, compilation), then ``repeats`` timed
    calls; ``{"min_s", "median_s", "max_s", "repeats", "warmup", "times_s"}``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"min_s": min(times), "median_s": statistics.median(times), "max_s": max(times), "repeats": repeats,
            "warmup": warmup, "times_s": times}


def ratio_to_bound(seconds: float, bound_seconds: float) -> float:
    """How many times its bound (the compute or memory floor) a measured time is: 1.0 is at the bound."""
    if bound_seconds <= 0:
        raise ValueError(f"a bound must be > 0 s, got {bound_seconds}")
    return seconds / bound_seconds


def write_report(out: str | Path, report: dict, render: Callable[[dict], str]) -> None:
    """``out``.json (the record) and ``out``.md (``render(report)``), each written whole or not at all."""
    from vlmatch.io import write_json, write_text

    write_json(Path(out).with_suffix(".json"), report)
    write_text(Path(out).with_suffix(".md"), render(report))
    print(f"wrote {out}.json and .md")
