"""Run folders never mix runs: a fresh run refuses a used folder, a resume must be the same run."""

import json

import pytest
import yaml

from vlmatch.cli import main
from vlmatch.errors import ConfigError
from vlmatch.training.config import load_config
from vlmatch.training.loop import train


def tiny(world, **train_over):
    return load_config(None, extra={
        "model": {"name": "vsepp", "embed_dim": 16, "word_dim": 8},
        "data": {"path": str(world), "val_max_images": 20, "min_word_count": 1},
        "train": {"epochs": 1, "batch_size": 32, "max_steps_per_epoch": 3, "log_every": 1, "threads": 1,
                  **train_over}})


def _steps(run):
    return [r["global_step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["type"] == "train"]


def test_a_fresh_run_refuses_a_folder_that_holds_a_run(small_world, tmp_path):
    run = tmp_path / "run"
    train(tiny(small_world), run, progress=False)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"already holds a run \(config.yaml, metrics.jsonl, last/, best/\); "
                                          r"continue it with `vlmatch train --resume .*--overwrite"):
        train(tiny(small_world, epochs=3), run, progress=False)
    assert json.loads((run / "last" / "trainer_state.json").read_text())["global_step"] == 3  # untouched
    train(tiny(small_world, epochs=2), run, progress=False, overwrite=True)
    assert _steps(run) == [1, 2, 3, 4, 5, 6]  # the new run from step 1, nothing of the old one
    assert (run / "notes.txt").read_text() == "mine"  # --overwrite removes only the run's own entries


@pytest.mark.slow  # two trainings
def test_the_issue_scenario_cannot_mix_two_runs(small_world, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world)))
    run = str(tmp_path / "run")
    assert main(["train", "--config", str(cfg), "--run-dir", run, "--no-progress"]) == 0
    capsys.readouterr()
    # a new run with other settings in the same folder is refused, and names the ways out
    assert main(["train", "--config", str(cfg), "--set", "train.epochs=3", "--run-dir", run, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    # the help's example value parses as a number (PyYAML alone gives the string '1e-4': a TypeError)
    assert main(["train", "--config", str(cfg), "--set", "train.lr=1e-4", "--run-dir", run, "--overwrite",
                 "--set", "train.stop_after_steps=2", "--set", "train.checkpoint_every_steps=1", "--no-progress"]) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["lr"] == 1e-4 and saved["train"]["stop_after_steps"] is None  # a one-off, never saved
    # editing the run's config makes it another run: --resume refuses it
    text = (tmp_path / "run" / "config.yaml").read_text()
    (tmp_path / "run" / "config.yaml").write_text(text.replace("margin: 0.2", "margin: 0.5"))
    assert main(["train", "--resume", run, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "made with another configuration: train.margin: 0.2 in the checkpoint, 0.5 now" in err
    (tmp_path / "run" / "config.yaml").write_text(text)
    # options that do not change the computation may differ; the resume does not stop again at step 2
    assert main(["train", "--resume", run, "--set", "train.threads=2", "--no-progress"]) == 0
    assert _steps(tmp_path / "run") == [1, 2, 3]


def test_resume_needs_a_checkpoint_and_refuses_overwrite(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path), "--overwrite"]) == 2
    assert "pass one of them" in capsys.readouterr().err
