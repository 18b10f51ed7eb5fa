import platform
import subprocess
import sys

import pytest

from vlmatch.training import loop
from vlmatch.training.config import load_config

# Allocate and write a 64 MB block and free it, as a training step does, many times: the page faults of each of
# the last 4 rounds. The first rounds grow the heap until a freed block fits the aligned request, and now and then
# a small allocation splits the freed block and one more round grows it: so the rounds are warmed up 10 times and
# the median of the last 4 is compared. One thread: the probe's allocations all come from the main arena.
# Transparent huge pages are off for the probe (prctl PR_SET_THP_DISABLE), so a page is 4 kB whatever the host's
# THP setting.
PROBE = """
import ctypes, resource, statistics, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
import torch
from vlmatch.training.allocator import keep_freed_memory
torch.set_num_threads(1)
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
for _ in range(10):
    torch.ones(16 * 2**20).sum()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 * 2**20).sum()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, int(statistics.median(faults)))
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's (mallopt)")


def _last_round_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    kept, faults = out.split()
    return kept, int(faults)


@pytest.mark.slow  # two processes of their own, each importing torch and allocating 64 MB 14 times
@glibc
def test_freed_memory_is_reused_without_faulting_its_pages_in_again():
    _, system = _last_round_faults("system")
    kept, reused = _last_round_faults("keep")
    assert kept == "True"
    assert system > 10_000  # 64 MB = 16,384 pages of 4 kB, mapped afresh by glibc's default
    assert reused < system / 10


def test_training_keeps_freed_memory_unless_the_option_is_off(small_world, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "keep_freed_memory", lambda: calls.append(1) or True)
    extra = {"model": {"name": "vsepp", "embed_dim": 32, "word_dim": 16},
             "data": {"path": str(small_world), "val_max_images": 100, "min_word_count": 1},
             "train": {"epochs": 1, "batch_size": 32, "max_steps_per_epoch": 1, "threads": 1}}
    loop.train(load_config(None, extra=extra), tmp_path / "on", progress=False)
    assert calls == [1]
    extra["train"]["reuse_freed_memory"] = False
    loop.train(load_config(None, extra=extra), tmp_path / "off", progress=False)
    assert calls == [1]
