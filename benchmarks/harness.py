"""The one harness of the speed benchmarks: the host a figure was measured on, timing with a warm-up and
repeats (min / median / max), the ratio of a time to its bound, and the result file pair (JSON + Markdown).

    sys.path.insert(0, str(Path(__file__).resolve().parent))   # a script of benchmarks/ (or another room)
    from harness import host, timed, ratio_to_bound, write_report

Figures differ by host: every result records ``host()`` (CPU model, vector flags, cores, threads, torch).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def cpu_flags() -> list[str]:
    """The CPU's vector-relevant flags (avx*, fma, amx*, sse4_2, f16c), sorted."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    keep = ("avx", "fma", "amx", "sse4_2", "f16c")
    return sorted({f for f in line.split(":")[-1].split() if f.startswith(keep)})


def cpu_model() -> str:
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host(note: str | None = None) -> dict:
    """The host record a result carries: CPU model and flags, cores, OMP_NUM_THREADS, torch's version when it is
    imported (this never imports it), and ``note`` (e.g. "the CPU was shared")."""
    import sys

    torch = sys.modules.get("torch")
    rec = {"cpu": cpu_model(), "flags": cpu_flags(), "cores": os.cpu_count(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "torch": getattr(torch, "__version__", None)}
    return {**rec, "note": note} if note else rec


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
