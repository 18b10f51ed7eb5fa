"""`--json` onto what is not a regular file: `-` is standard output (the JSON alone there, the table on standard
error); /dev/stdout, a FIFO and a device are written in place, never replaced by a renamed file (the atomic write is
for regular files); /dev/full is an error in one line naming it. Run as users run it: `vlmatch` in its own process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import vlmatch
from tests.search.photo_index import photo_index  # noqa: F401 (the session's index fixture)

SRC = Path(vlmatch.__file__).resolve().parents[1]


def _vlmatch(*args, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", *map(str, args)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=300)


@pytest.mark.slow  # vlmatch in a process of its own
def test_json_dash_is_standard_output_alone(photo_index):  # noqa: F811
    r = _vlmatch("search", photo_index, "a dog on the grass", "-k", "3", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the JSON alone: it parses
    assert doc["query"] == "a dog on the grass" and len(doc["results"]) == 3
    assert "rank" in r.stderr  # the table went to standard error
    assert not Path("-").exists()


@pytest.mark.slow  # a search in a process of its own
def test_json_onto_dev_stdout_writes_there_and_keeps_the_link(photo_index):  # noqa: F811
    if not os.path.islink("/dev/stdout"):
        pytest.skip("/dev/stdout is not a link here")
    before = os.readlink("/dev/stdout")
    r = _vlmatch("search", photo_index, "a dog on the grass", "-k", "2", "--json", "/dev/stdout")
    assert r.returncode == 0, r.stderr
    assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == before
    assert '"results": [' in r.stdout and r.stdout.rstrip().endswith("}")


@pytest.mark.slow  # vlmatch in a process of its own
def test_json_onto_a_fifo_reaches_its_reader_and_the_fifo_stays(photo_index, tmp_path):  # noqa: F811
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    r = _vlmatch("index", "duplicates", photo_index, "--json", fifo)
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [p.name for p in tmp_path.iterdir()] == ["pipe"]
    assert "groups" in json.loads(got[0])


def test_json_onto_dev_full_is_one_line_naming_it_and_the_device_stays(photo_index):  # noqa: F811
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    r = _vlmatch("index", "duplicates", photo_index, "--json", "/dev/full")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err[-1] == "vlmatch: error: /dev/full: could not be written: No space left on device"
    assert "Traceback" not in r.stderr and stat.S_ISCHR(os.stat("/dev/full").st_mode)

