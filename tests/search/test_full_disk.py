"""A full disk, made for real (a small tmpfs mounted for the test: root only, skipped with the reason otherwise):
`vlmatch index build` and `vlmatch index update` end in one line naming the file that found no room, exit 2 -- not
SIGBUS (exit 135, no word: rows written through a memory map the disk has no room for), not an OSError naming no
path -- and an update leaves the index it started from searchable as it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import vlmatch

from .photo_index import draw_photos, save_models

SRC = Path(vlmatch.__file__).resolve().parents[1]


def _vlmatch(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "VLMATCH_DECODE_WORKERS": "0"}
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture
def small_disk(tmp_path):
    """mount(kb) -> a folder on a tmpfs of that many KiB, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root")
    mounts = []

    def mount(kb: int) -> Path:
        where = tmp_path / f"disk{len(mounts)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", str(where)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _build(models, photos, out) -> subprocess.CompletedProcess:
    return _vlmatch("index", "build", "--model", models["model"], "--retriever", models["retriever"], "--images",
                    photos, "--out", out, "--backbone", "efficientnet-lite0", "--no-progress")


def _kb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) // 1024


def _one_named_line(r, disk: Path) -> str:
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(disk) in err[0] and "No space left on device" in err[0], err[0]
    return err[0]


@pytest.mark.slow  # two builds of 120 photos, each in a process of its own
def test_a_build_onto_a_full_disk_is_one_line_naming_the_file(tmp_path, small_disk):
    models = save_models(tmp_path / "ck")
    photos = draw_photos(tmp_path / "photos", 120)
    assert _build(models, photos, tmp_path / "whole").returncode == 0
    disk = small_disk(_kb(tmp_path / "whole") * 2 // 3)  # two thirds of what the index needs
    _one_named_line(_build(models, photos, disk / "idx"), disk)


@pytest.mark.slow  # builds, an update and searches, each in a process of its own
def test_an_update_onto_a_full_disk_is_one_line_and_the_index_stays_as_it_was(tmp_path, small_disk):
    models = save_models(tmp_path / "ck")
    photos = draw_photos(tmp_path / "photos", 40)
    assert _build(models, photos, tmp_path / "whole").returncode == 0
    disk = small_disk(_kb(tmp_path / "whole") * 3 + 1024)
    idx = disk / "idx"
    r = _build(models, photos, idx)
    assert r.returncode == 0, r.stderr
    before = _vlmatch("search", idx, "a dog on the grass", "-k", "5")
    assert before.returncode == 0, before.stderr
    draw_photos(tmp_path / "more", 120, seed=3)
    for p in (tmp_path / "more").iterdir():  # new photos in the indexed folder: the update encodes them
        shutil.move(p, photos / f"new_{p.name}")
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:  # the disk full but for a few pages
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 16 * 1024))
    _one_named_line(_vlmatch("index", "update", idx, "--no-progress"), disk)
    (disk / "filler").unlink()
    after = _vlmatch("search", idx, "a dog on the grass", "-k", "5")
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr
