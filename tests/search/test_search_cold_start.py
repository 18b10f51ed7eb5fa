"""`vlmatch search` / `explain` from the command line (a fresh process, as a user runs them): a finished
read-only command ends without the interpreter's teardown (cli.quick_exit) yet prints its whole table,
writes its --json, exits 0, and with VLMATCH_PROFILE=1 says where its time went; the same query in-process
(main(argv), which returns) gives the same ranking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmatch.cli import main

from .photo_index import photo_index  # noqa: F401 (a session fixture)

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _vlmatch(*argv, profile=False):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if profile:
        env["VLMATCH_PROFILE"] = "1"
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow  # a search in a fresh process
def test_search_from_a_fresh_process_prints_everything_and_profiles(photo_index, tmp_path, capsys):  # noqa: F811
    out = _vlmatch("search", str(photo_index), "a dog on the grass", "-k", "5", "--json", str(tmp_path / "r.json"),
                   profile=True)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert rows[0].split()[:3] == ["rank", "score", "stage1"] and len(rows) == 6
    got = json.loads((tmp_path / "r.json").read_text())
    assert [r["rank"] for r in got["results"]] == [1, 2, 3, 4, 5]
    phases = out.stderr.strip().splitlines()[-1]
    assert phases.startswith("vlmatch: profile: import ") and all(f" {p} " in phases for p in ("load", "encode",
                                                                                              "search", "total"))
    assert main(["search", str(photo_index), "a dog on the grass", "-k", "5"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == rows


@pytest.mark.slow  # explain in a process of its own
def test_explain_from_a_fresh_process_writes_its_picture(photo_index, tmp_path):  # noqa: F811
    out = _vlmatch("explain", "--index", str(photo_index), "--id", "1", "--text", "a red ball", "--out",
                   str(tmp_path / "m.png"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m.png").stat().st_size > 0 and "maps, score" in out.stdout
    assert "profile" not in out.stderr  # only with VLMATCH_PROFILE set
