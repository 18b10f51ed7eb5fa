"""One writer per run folder: while a run trains in a folder, a second run of it (fresh, --overwrite or
--resume) is refused in one line naming the process that holds it, and nothing of the first is touched."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

import vlmatch
from vlmatch.cli import main

from .test_rundir import _steps, tiny

# the first run: trains as usual, but waits at its first metrics row until the gate file exists
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from vlmatch.cli import main
    from vlmatch.training import loop
    torch.set_num_threads(1)
    gate = Path(sys.argv[1])
    real = loop.append_line

    def append_line(path, line):
        real(path, line)
        if not gate.exists():
            gate.with_name("waiting").touch()
            while not gate.exists():
                time.sleep(0.02)

    loop.append_line = append_line
    sys.exit(main(sys.argv[2:]))
""")


def start_first_run(argv, gate: Path) -> subprocess.Popen:
    src = str(Path(vlmatch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(gate), *argv], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    waiting, t0 = gate.with_name("waiting"), time.monotonic()
    while not waiting.exists() and p.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    assert waiting.exists(), p.communicate()[1]
    return p


def files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".vlmatch.lock"}


@pytest.mark.slow  # two trainings each, one in a process of its own
@pytest.mark.parametrize("second", ["overwrite", "fresh", "resume"])
def test_a_second_run_of_a_folder_in_training_is_refused_and_changes_nothing(small_world, tmp_path, capsys, second):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world, checkpoint_every_steps=1)))
    run, gate = tmp_path / "run", tmp_path / "gate"
    argv = ["train", "--config", str(cfg), "--run-dir", str(run), "--no-progress"]
    if second == "resume":  # a run with a checkpoint, resumed by the first process and then once more
        assert main([*argv, "--set", "train.stop_after_steps=1"]) == 0
        first = start_first_run(["train", "--resume", str(run), "--no-progress"], gate)
    else:
        first = start_first_run(argv, gate)
    try:
        before = files(run)
        again = {"overwrite": [*argv, "--overwrite"], "fresh": argv,
                 "resume": ["train", "--resume", str(run), "--no-progress"]}[second]
        capsys.readouterr()
        assert main(again) == 2
        err = capsys.readouterr().err.strip()
        assert f"{run} is being written by process {first.pid} (vlmatch train)" in err, err
        assert "one training run per run folder" in err and len(err.splitlines()) == 1
        assert files(run) == before  # nothing removed, rewritten or added
    finally:
        gate.touch()
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert _steps(run) == [1, 2, 3]  # the first run's rows alone, none lost, none of another run
    assert main([*argv, "--overwrite"]) == 0  # the lock went with its holder


@pytest.mark.slow  # a training in a process of its own, killed
def test_the_lock_is_dropped_when_its_holder_is_killed(small_world, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world)))
    run, gate = tmp_path / "run", tmp_path / "gate"
    argv = ["train", "--config", str(cfg), "--run-dir", str(run), "--no-progress"]
    first = start_first_run(argv, gate)
    first.kill()
    first.communicate(timeout=60)
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads((run / "last" / "trainer_state.json").read_text())["global_step"] == 3
