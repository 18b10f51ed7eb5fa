"""Readers never starve a writer: a rebuild whose encoding is done swaps its parts in within a bound while
readers keep opening the index in a loop (writer preference: ``.vlmatch.swap.lock``), says that it waits,
and gives up after ``SWAP_WAIT_S`` with nothing changed when a reader never lets go."""

import fcntl
import os
import threading
import time
from contextlib import contextmanager

import pytest

import vlmatch
from vlmatch import io
from vlmatch.search import index as index_module
from vlmatch.search.backends import folder

from .test_index_safety import NAMES, build, ckpts  # noqa: F401  (the module fixture)
from .tiny import jpegs, tiny_backbone  # noqa: F401  (autouse)

READERS = 4
OPEN_S = 0.2  # each reader's opening is stretched so that together they always hold the read lock
BOUND_S = 60  # the rebuild must commit within this while they loop (it hung for minutes before)


@pytest.mark.slow  # seconds of readers looping
def test_a_rebuild_commits_within_a_bound_while_readers_loop(ckpts, tmp_path, monkeypatch, capsys):  # noqa: F811
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    old_model = vlmatch.Index.open(out).manifest["model"]["sha256"]
    stop, opened, errors = threading.Event(), [], []
    readers: list[threading.Thread] = []
    real_reading = index_module.reading

    @contextmanager
    def slow_reading(path):  # a reader's opening takes a while, as a real one's does (seconds on a large index)
        with real_reading(path) as ok:
            time.sleep(OPEN_S)
            yield ok

    monkeypatch.setattr(index_module, "reading", slow_reading)

    def reader():
        while not stop.is_set():
            try:
                idx = vlmatch.Index.open(out)
                idx.search("a red dog", k=3)
                opened.append((time.monotonic(), idx.manifest["model"]["sha256"]))
            except BaseException as e:  # noqa: BLE001 -- reported by the test
                errors.append(e)
                return

    waits = {}

    def hook(name):
        if name in ("swap:intent", "swap:wait"):
            waits.setdefault(name, time.monotonic())

    monkeypatch.setattr(io, "crash_hook", hook)
    readers.extend(threading.Thread(target=reader, daemon=True) for _ in range(READERS))
    for i, t in enumerate(readers):
        t.start()
        time.sleep(OPEN_S * 3 / READERS * (i > 0))  # staggered: some reader is always opening
    while len(opened) < 2 * READERS:
        time.sleep(0.01)
    result = {}
    writer = threading.Thread(target=lambda: result.setdefault("rc", build(ckpts, imgs, out, model="b")), daemon=True)
    t0 = time.monotonic()
    writer.start()
    writer.join(BOUND_S)
    done = time.monotonic()
    starved = writer.is_alive()
    stop.set()
    writer.join(120)
    for t in readers:
        t.join(30)
    assert not starved, f"the rebuild did not commit within {BOUND_S} s while {READERS} readers looped"
    assert result["rc"] == 0 and not errors
    assert "swap:wait" in waits and done - waits["swap:wait"] < 10  # it waited for the readers, briefly
    assert "waiting for the readers opening the index to finish" in capsys.readouterr().err
    new_model = vlmatch.Index.open(out).manifest["model"]["sha256"]
    assert new_model != old_model
    # the readers went on opening throughout, and saw the new version once it was in
    assert any(m == old_model for _, m in opened) and any(when > t0 and m == new_model for when, m in opened)


def test_a_reader_that_never_lets_go_stops_the_writer_after_the_bound_with_nothing_changed(ckpts, tmp_path, monkeypatch,  # noqa: F811
                                                                                          capsys):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    before = vlmatch.Index.open(out).manifest
    monkeypatch.setattr(folder, "SWAP_WAIT_S", 0.5)
    fd = os.open(out / folder.READ_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a reader stuck in the middle of its opening
        capsys.readouterr()
        assert build(ckpts, imgs, out, model="b") == 2
        err = capsys.readouterr().err
        assert "waiting for the readers opening the index to finish" in err
        assert f"{out / folder.READ_LOCK}: readers kept the index open for 0.5 s, so its new version was not swapped " \
               "in (nothing changed; the work done is kept in build/): run the same command again" in err
    finally:
        os.close(fd)
    assert vlmatch.Index.open(out).manifest == before
    assert build(ckpts, imgs, out, model="b") == 0
    assert vlmatch.Index.open(out).manifest["model"]["sha256"] != before["model"]["sha256"]
