"""An indexed photo's file checked against its row: gone, a special file (refused from its stat, never opened),
another size, touched with the same content (accepted, hashed once), rewritten at the same size (refused)."""

import hashlib
import os
import threading

import pytest

from vlmatch.search.library import unchanged
from vlmatch.search.library.unchanged import PhotoChanged, PhotoMissing, check_unchanged


def photo(path, data=b"\xff\xd8 indexed photo bytes \xff\xd9"):
    path.write_bytes(data)
    st = os.stat(path)
    return {"size": len(data), "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(data).hexdigest()}


def within(seconds, fn, *args):
    """``fn(*args)`` in a thread; fails the test when it has not returned within ``seconds`` (a hang)."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} hung"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_the_file_as_indexed_passes(tmp_path):
    p = tmp_path / "a.jpg"
    assert check_unchanged(photo(p), p).st_size == p.stat().st_size


def test_a_fifo_in_its_place_is_refused_without_opening_it(tmp_path):
    p = tmp_path / "a.jpg"
    row = photo(p)
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(PhotoChanged, match=r"is a FIFO \(named pipe\) now.*refused unopened; run vlmatch index update"):
        within(5, check_unchanged, row, p)


def test_a_folder_in_its_place_is_refused(tmp_path):
    p = tmp_path / "a.jpg"
    row = photo(p)
    p.unlink()
    p.mkdir()
    with pytest.raises(PhotoChanged, match="is a folder now"):
        check_unchanged(row, p)


def test_a_file_gone_is_missing(tmp_path):
    p = tmp_path / "a.jpg"
    row = photo(p)
    p.unlink()
    with pytest.raises(PhotoMissing, match="no longer on disk"):
        check_unchanged(row, p)


def test_another_size_is_changed_without_reading_it(tmp_path, monkeypatch):
    p = tmp_path / "a.jpg"
    row = photo(p)
    p.write_bytes(b"another photo, longer than the first one was")
    monkeypatch.setattr(unchanged, "_sha256", lambda path: pytest.fail("hashed a file whose size tells"))
    with pytest.raises(PhotoChanged, match=r"changed since indexing \(\d+ bytes, indexed \d+\)") as e:
        check_unchanged(row, p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_a_touched_file_with_the_same_content_passes_and_is_hashed_once(tmp_path, monkeypatch):
    p = tmp_path / "a.jpg"
    row = photo(p)
    os.utime(p, ns=(row["mtime_ns"] + 10**9, row["mtime_ns"] + 10**9))
    hashed = []
    real = unchanged._sha256
    monkeypatch.setattr(unchanged, "_sha256", lambda path: hashed.append(path) or real(path))
    for _ in range(3):
        check_unchanged(row, p)
    assert len(hashed) == 1


def test_the_same_size_rewritten_is_changed(tmp_path):
    p = tmp_path / "a.jpg"
    row = photo(p)
    data = bytearray(p.read_bytes())
    data[3] ^= 0xFF
    p.write_bytes(bytes(data))
    os.utime(p, ns=(row["mtime_ns"] + 10**9, row["mtime_ns"] + 10**9))
    with pytest.raises(PhotoChanged, match="modified after it was encoded"):
        check_unchanged(row, p)


def test_a_row_that_records_nothing_is_not_checked(tmp_path):
    p = tmp_path / "a.jpg"
    p.write_bytes(b"x")
    check_unchanged({}, p)
