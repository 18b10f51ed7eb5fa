"""Keep the memory a training step frees for the next step (glibc, Linux): a step allocates the same large tensors
every time, and glibc would ``munmap`` each freed block above its mmap threshold, so the kernel faulted and zeroed
the pages again every step (up to a third of a SCAN, CAAN or MMCA step on a 2-core CPU). The process keeps its
peak heap instead, which suits training (``train.reuse_freed_memory``), not a service. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: the largest, about 2 GiB


def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and keep freed memory there; True where glibc took both settings."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows): nothing to set
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
