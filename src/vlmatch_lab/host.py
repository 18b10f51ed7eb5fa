"""The host a figure was measured on, recorded with every result of the rooms (figures differ by host): CPU model
and vector flags, cores, OMP_NUM_THREADS, torch's version."""

from __future__ import annotations

import os
import platform
import sys
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
    torch = sys.modules.get("torch")
    rec = {"cpu": cpu_model(), "flags": cpu_flags(), "cores": os.cpu_count(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "torch": getattr(torch, "__version__", None)}
    return {**rec, "note": note} if note else rec
