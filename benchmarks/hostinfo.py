"""The host a benchmark ran on: CPU model and vector flags (figures differ by host: record them with every result)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_flags() -> list[str]:
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
