"""Crash-safe writes: kill the checkpoint swap at each of its steps; the user's umask is respected."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vlmatch import io

STEPS = ("cleaned", "written", "old-moved", "new-in", "done")
SRC = str(Path(io.__file__).resolve().parents[1])


def save(path, version):
    with io.atomic_dir(path) as tmp:
        for name in ("a.txt", "b.txt"):
            (tmp / name).write_text(version)


def save_killed_at(path, version, step):
    """Save in a child process that dies (os._exit, no cleanup of any kind) right after ``step``."""
    # io.py alone (stdlib + numpy), loaded without the package so the child starts fast (no torch)
    code = ("import importlib.util, os, sys\nspec = importlib.util.spec_from_file_location('io_', sys.argv[4])\n"
            "io = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(io)\n"
            "io.crash_hook = lambda s: os._exit(9) if s == sys.argv[3] else None\n"
            "with io.atomic_dir(sys.argv[1]) as tmp:\n"
            "    for n in ('a.txt', 'b.txt'):\n        (tmp / n).write_text(sys.argv[2])\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run([sys.executable, "-c", code, str(path), version, step, io.__file__], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 9, r.stderr  # it really died at that step


def version_found(path):
    d = io.complete_dir(path)
    assert d is not None, "no complete checkpoint left"
    a, b = (d / "a.txt").read_text(), (d / "b.txt").read_text()
    assert a == b, "a mixed checkpoint"
    return d.name, a


@pytest.mark.parametrize("step, expected", [
    ("cleaned", ("last", "v1")), ("written", ("last", "v1")), ("old-moved", ("last.prev", "v1")),
    ("new-in", ("last", "v2")), ("done", ("last", "v2"))])
def test_a_kill_at_each_step_of_the_swap_leaves_a_complete_checkpoint(tmp_path, step, expected):
    last = tmp_path / "last"
    save(last, "v1")
    save_killed_at(last, "v2", step)
    assert version_found(last) == expected
    save(last, "v3")  # the next save completes and cleans up what the killed one left
    assert version_found(last) == ("last", "v3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # no .last.*.tmp, no last.prev


def test_two_kills_in_a_row_never_lose_the_only_complete_version(tmp_path):
    last = tmp_path / "last"
    save(last, "v1")
    save_killed_at(last, "v2", "old-moved")  # last/ moved to last.prev, the new one not yet in
    for step in ("cleaned", "written", "old-moved"):  # the next saves die too, at each early step
        save_killed_at(last, "v3", step)
        assert version_found(last) == ("last.prev", "v1")


def test_failures_inside_the_swap_leave_a_complete_version_and_no_debris(tmp_path, monkeypatch):
    last = tmp_path / "last"
    save(last, "v1")
    real_replace, real_rmtree = os.replace, shutil.rmtree
    calls = []

    def replace_failing_at_new_in(a, b):
        calls.append(Path(b).name)
        if Path(b).name == "last":  # the rename of the new version into place
            raise OSError(28, "No space left on device")
        return real_replace(a, b)

    monkeypatch.setattr(io.os, "replace", replace_failing_at_new_in)
    with pytest.raises(OSError, match="No space"):
        save(last, "v2")
    assert version_found(last) == ("last.prev", "v1")
    monkeypatch.setattr(io.os, "replace", real_replace)

    def rmtree_dying(p, *a, **k):  # dies half-way through deleting the old version
        (Path(p) / "a.txt").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(io.shutil, "rmtree", rmtree_dying)
    with pytest.raises(KeyboardInterrupt):
        save(last, "v2")
    assert version_found(last) == ("last", "v2")  # the half-deleted one is under a temporary name
    monkeypatch.setattr(io.shutil, "rmtree", real_rmtree)
    save(last, "v3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_importing_io_leaves_the_process_umask_alone():
    code = ("import os\ncalls = []\nreal = os.umask\nos.umask = lambda m: calls.append(m) or real(m)\n"
            "import vlmatch.io\nassert not calls, calls\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()


@pytest.mark.parametrize("umask", [0o027, 0o002])
def test_files_and_folders_follow_the_users_umask(tmp_path, umask):
    import torch

    from vlmatch import create_model
    from vlmatch.checkpoints.write import save_training_state

    old = os.umask(umask)
    try:
        m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
        save_training_state(tmp_path / "run" / "last", m, torch.optim.Adam(m.parameters()), {"global_step": 0})
        io.write_text(tmp_path / "run" / "config.yaml", "x: 1\n")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    for d in (tmp_path / "run", tmp_path / "run" / "last"):
        assert mode(d) == 0o777 & ~umask, d
    for f in ("last/optimizer.safetensors", "last/model.safetensors", "last/config.json", "config.yaml"):
        assert mode(tmp_path / "run" / f) == 0o666 & ~umask, f


def test_a_link_to_a_regular_file_stays_a_link_and_its_target_is_replaced(tmp_path):
    from vlmatch.io import is_special, write_text

    (tmp_path / "target.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    write_text(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "target.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]
    assert not is_special(tmp_path / "target.json") and not is_special(tmp_path / "new.json")
    assert is_special("/dev/stdout") and is_special("/proc/self/fd/1")


def test_a_regular_file_under_dev_shm_is_still_written_atomically():
    import os

    from vlmatch.io import is_special

    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    assert not is_special(f"/dev/shm/vlmatch-test-{os.getpid()}.json") and is_special("/dev/null")
