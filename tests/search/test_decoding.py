"""A build's or an update's decoding processes die with it and never keep its writer lock: after a
``kill -9`` of a real ``vlmatch index build`` (or ``index update``) mid-build, its workers are gone within
seconds and the rerun, started at once, takes the folder and finishes."""

import os
import signal
import time
from pathlib import Path

import pytest

import vlmatch

from .test_index_safety import ckpts  # noqa: F401  (the module fixture)
from .tiny import build_args, child, jpegs, run_child, tiny_backbone  # noqa: F401  (autouse)

NAMES = [f"p{i:02d}.jpg" for i in range(40)]
GONE_S = 5  # the workers must be gone this soon after their parent (they lingered for minutes)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_at_first_batch(args, gate: Path) -> list[int]:
    """Start ``vlmatch ARGS`` in a child, wait until its decoding workers run and it holds the lock, then
    ``kill -9`` it; returns its workers' pids."""
    p = child(args, gate=gate)
    try:
        waiting, t0 = gate.with_name(gate.name + ".waiting"), time.monotonic()
        while not waiting.exists() and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.02)
        assert waiting.exists(), p.communicate()[1]
        workers = children_of(p.pid)
        assert len(workers) >= 2, "the build decodes in worker processes"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)  # not communicate(): a leftover worker would hold its pipes open
        p.stdout.close()
        p.stderr.close()
    return workers


def wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive ``GONE_S`` after the call (each then ended, so that a failure leaves nothing)."""
    t0 = time.monotonic()
    while any(alive(pid) for pid in pids) and time.monotonic() - t0 < GONE_S:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture
def two_workers(monkeypatch):
    monkeypatch.setenv("VLMATCH_DECODE_WORKERS", "2")


@pytest.mark.slow  # a build killed and run again, in processes of their own
def test_a_killed_build_leaves_no_workers_and_the_rerun_finishes(ckpts, tmp_path, two_workers):  # noqa: F811
    imgs, out = jpegs(tmp_path / "imgs", NAMES), tmp_path / "idx"
    args = build_args(ckpts["a"], imgs, out, retriever=ckpts["vsepp"])
    workers = kill_at_first_batch(args, tmp_path / "gate")
    rerun = run_child(args)  # at once: the lock must be free already
    left = wait_gone(workers)
    assert rerun.returncode == 0, rerun.stderr
    assert left == []
    assert sorted(it["rel"] for it in vlmatch.Index.open(out).items) == NAMES


@pytest.mark.slow  # a build, an update killed and run again, in processes of their own
def test_a_killed_update_leaves_no_workers_and_the_rerun_finishes(ckpts, tmp_path, two_workers):  # noqa: F811
    imgs, out = jpegs(tmp_path / "imgs", NAMES[:2]), tmp_path / "idx"
    assert run_child(build_args(ckpts["a"], imgs, out, retriever=ckpts["vsepp"])).returncode == 0
    jpegs(imgs, NAMES[2:], seed=3)
    args = ["index", "update", str(out), "--no-progress", "--batch-size", "2"]
    workers = kill_at_first_batch(args, tmp_path / "gate")
    rerun = run_child(args)
    left = wait_gone(workers)
    assert rerun.returncode == 0, rerun.stderr
    assert left == []
    assert sorted(it["rel"] for it in vlmatch.Index.open(out).items) == NAMES


def test_a_worker_outlives_its_parent_by_at_most_a_moment(tmp_path):
    """The watch itself, without a build: a process that forks a decoding pool and dies at once."""
    import subprocess
    import sys

    code = ("import os, sys, time\n"
            "from vlmatch.search.decoding import decoder_pool\n"
            "os.environ['VLMATCH_DECODE_WORKERS'] = '2'\n"
            "with decoder_pool(40) as pool:\n"
            "    pids = [pool.submit(os.getpid).result() for _ in range(4)]\n"
            "    print(' '.join(map(str, sorted(set(pids)))), flush=True)\n"
            "    os._exit(9)\n")
    src = str(Path(vlmatch.__file__).resolve().parents[1])
    with open(tmp_path / "out", "w") as out:  # a file, not a pipe: a leftover worker would hold a pipe open
        r = subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, timeout=60,
                           env={**os.environ, "PYTHONPATH": src})
    said = (tmp_path / "out").read_text()
    pids = [int(x) for x in said.split()]
    assert r.returncode == 9 and pids, said
    assert wait_gone(pids) == []
