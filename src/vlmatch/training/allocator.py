"""Keep the memory a training step frees for the next step (glibc's allocator, Linux).

A training step allocates the same large tensors every step (attention tensors of every pair of the
batch and their gradients: tens of MB each). glibc serves a block above its mmap threshold (at most
32 MB) with a fresh ``mmap`` and gives it back with ``munmap`` when freed, so every step faults those
pages in again and the kernel zeroes each one: on a 2-core CPU that is up to a third of a SCAN, CAAN or
MMCA step (``benchmarks/train_roofline.py``'s ``--system-allocator`` run beside the default measures it).
:func:`keep_freed_memory` turns that off for the process: large blocks come from the heap, and freed
memory stays in it for the next step (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 2 GiB - 1)``).

The cost: the process keeps its peak heap until it exits rather than returning freed pages to the
system, which suits a training process (its peak comes back every step) and not a long-lived service, so
only training calls it (``train.reuse_freed_memory``, default on). Elsewhere (macOS, musl) it does nothing.
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
