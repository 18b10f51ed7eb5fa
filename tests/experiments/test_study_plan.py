"""experiments/study.py: every planned run of the convergence study resolves to a valid config, so a
session that starts the queue does not find a typo an hour in."""

import pytest

from tests.benchmark_scripts import load_script
from vlmatch.features.backbones import BACKBONES
from vlmatch.training.config import load_config


def _study():
    return load_script("study")


def _config_and_overrides(args):
    it = iter(args)
    config, overrides = None, []
    for flag in it:
        value = next(it)
        if flag == "--config":
            config = value
        elif flag == "--input-size":
            assert int(value) % 32 == 0, value
        elif flag == "--backbone":
            assert value in BACKBONES, value
        else:
            assert flag == "--set", f"unexpected flag {flag}"
            overrides.append(value)
    return config, overrides


@pytest.mark.parametrize("entry", _study().PLAN, ids=lambda e: e[0])
def test_every_planned_run_resolves(entry):
    name, args, note = entry
    study = _study()
    if args[0] == study.RERANK:  # re-ranks runs planned before it
        earlier = [n for n, _, _ in study.PLAN[:[n for n, _, _ in study.PLAN].index(name)]]
        runs = [args[i + 1] for i, a in enumerate(args) if a in ("--run", "--text-run")]
        assert runs and all(r in earlier for r in runs), runs
        cmd = study.command(name, args, note)
        assert cmd[1].endswith(study.RERANK) and cmd[-4:] == ["--name", name, "--threads", "1"]
        return
    config, overrides = _config_and_overrides(args)
    cfg = load_config(config, overrides + ["train.threads=1"])
    assert note and cfg["model"]["name"]
    if name.startswith("s22_"):  # a sweep point: short, at its own learning rate
        assert cfg["train"]["max_steps_per_epoch"] == 120 and cfg["train"]["lr_schedule"] is None


def test_names_are_unique_and_next_skips_finished_runs(tmp_path, monkeypatch, capsys):
    study = _study()
    names = [n for n, _, _ in study.PLAN]
    assert len(names) == len(set(names))
    monkeypatch.setattr(study, "RUNS", tmp_path)
    (tmp_path / f"{names[0]}.json").write_text("{}")
    assert study.main(["next"]) == 0
    out = capsys.readouterr().out
    assert f"--name {names[1]}" in out and f"--name {names[0]} " not in out


def test_run_starts_nothing_past_its_start_before_time(tmp_path, monkeypatch, capsys):
    study = _study()
    monkeypatch.setattr(study, "RUNS", tmp_path)
    started = []
    monkeypatch.setattr(study.subprocess, "run", lambda cmd: started.append(cmd))
    monkeypatch.setattr(study.time, "strftime", lambda fmt: "17:05")
    assert study.main(["run", "--start-before", "17:00"]) == 0
    assert not started and "past 17:00" in capsys.readouterr().out
