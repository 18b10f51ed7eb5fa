"""What `vlmatch train --resume` says about a run it cannot continue as it is: killed before its first
checkpoint (it starts over), given another --config (refused), a metrics.jsonl torn by a kill (the torn
row dropped) or damaged before its end, a hand-edited trainer_state.json (one line naming the file and
the field)."""

import json
import shutil

import pytest
import yaml

from vlmatch.cli import main

from .test_rundir import _steps, tiny


def _trained(folder, run_name, cfg_name, cfg, stop_after):
    """A run of ``cfg`` stopped after ``stop_after`` steps, trained once per module (each test edits a copy)."""
    folder.mkdir()
    (folder / cfg_name).write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(folder / cfg_name), "--run-dir", str(folder / run_name), "--set",
                 f"train.stop_after_steps={stop_after}", "--no-progress"]) == 0
    return folder


def _copy(template, tmp_path, run_name, capsys):
    for path in template.iterdir():
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, tmp_path / path.name)
    capsys.readouterr()
    return tmp_path / run_name


@pytest.fixture(scope="module")
def _run_template(small_world, tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("resume") / "t", "run", "c.yaml",
                    tiny(small_world, checkpoint_every_steps=1), 2)


@pytest.fixture
def run(_run_template, tmp_path, capsys):
    """A run stopped at step 2 with its checkpoint at step 2 (tmp_path/run), its config file tmp_path/c.yaml."""
    return _copy(_run_template, tmp_path, "run", capsys)


def resume(run, *extra):
    return main(["train", "--resume", str(run), "--no-progress", *extra])


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow  # a training killed and resumed
def test_a_run_killed_before_its_first_checkpoint_starts_over_on_resume(run, capsys):
    (run / "last").rename(run.parent / "last.gone")  # as a kill early in epoch 1 leaves it: config.yaml, rows
    assert not (run / "best").exists()
    assert resume(run) == 0
    assert "stopped before its first checkpoint (no last/): starting it over from step 1" in capsys.readouterr().err
    assert _steps(run) == [1, 2, 3]  # one run, from step 1, no row of the killed start kept twice


def test_a_run_with_best_but_no_last_names_overwrite(run, capsys):
    (run / "last").rename(run.parent / "last.gone")
    (run / "best").mkdir(exist_ok=True)
    assert resume(run) == 2
    err = one_line(capsys)
    assert "no last/ checkpoint in it to continue from" in err and f"--run-dir {run} --overwrite" in err


def test_resume_with_another_config_is_refused(run, small_world, tmp_path, capsys):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**tiny(small_world), "model": {"name": "scan", "embed_dim": 16, "word_dim": 8}}))
    state = (run / "last" / "trainer_state.json").read_bytes()
    assert resume(run, "--config", str(other)) == 2
    err = one_line(capsys)
    assert f"--resume {run} continues the run with its own config" in err and f"--config {other}" in err
    assert (run / "last" / "trainer_state.json").read_bytes() == state


@pytest.mark.slow  # a training killed and resumed
def test_a_metrics_row_torn_by_a_kill_is_dropped_on_resume(run):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"type": "train", "epoch": 0, "st')  # a kill in the middle of the write of step 3's row
    assert resume(run) == 0
    assert _steps(run) == [1, 2, 3]
    assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())


def test_a_metrics_file_damaged_before_its_end_is_named(run, capsys):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0][:10], *lines[1:]]) + "\n")
    assert resume(run) == 2
    err = one_line(capsys)
    assert f"{run / 'metrics.jsonl'}: line 1 is not a row vlmatch train wrote" in err


@pytest.mark.parametrize("field,value,says", [
    ("epoch", "one", "epoch is 'one'; it must be a whole number >= 0"),
    ("global_step", 2.5, "global_step is 2.5; it must be a whole number >= 0"),
    ("step_in_epoch", -1, "step_in_epoch is -1; it must be a whole number >= 0"),
    ("best_rsum", None, "best_rsum is None; it must be a number"),
    ("global_step", 99999, "global_step is 99999, but epoch 0 and step_in_epoch 2 of this run make it 2"),
    ("global_step", 1, "global_step is 1, but epoch 0 and step_in_epoch 2 of this run make it 2"),
    ("step_in_epoch", 7, "step_in_epoch is 7, but an epoch of this run has 3 steps"),
])
def test_a_hand_edited_trainer_state_is_refused_naming_the_file_and_field(run, capsys, field, value, says):
    path = run / "last" / "trainer_state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, field: value}))
    kept = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    assert resume(run, "--set", "train.threads=2") == 2
    err = one_line(capsys)
    assert f"{path}: {says}" in err and "--overwrite" in err
    assert {name: (run / name).read_bytes() for name in kept} == kept  # refused before the log is cut


@pytest.mark.parametrize("made,says", [(False, "no such run folder"), (True, "no config.yaml in it")])
def test_resume_of_a_folder_that_holds_no_run_says_so(tmp_path, capsys, made, says):
    run = tmp_path / "run"
    if made:
        run.mkdir()
    assert resume(run) == 2
    err = one_line(capsys)
    assert f"--resume {run}: {says}" in err and "bundled" not in err and not (tmp_path / "run" / ".vlmatch.lock").exists()


@pytest.fixture(scope="module")
def _run2_template(small_world, tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("resume2") / "t", "run2", "c2.yaml",
                    tiny(small_world, epochs=2, checkpoint_every_steps=1), 4)


@pytest.fixture
def run2(_run2_template, tmp_path, capsys):
    """A run of 2 epochs of 3 steps stopped at step 4: validated once (epoch 1, at step 3), checkpoint at step 4."""
    return _copy(_run2_template, tmp_path, "run2", capsys)


def _edit_state(run, **fields):
    path = run / "last" / "trainer_state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, **fields}))
    return path, state


@pytest.mark.parametrize("fields,says", [
    ({"global_step": 3}, "global_step is 3, but {log} ends epoch 0 at step 3 and step_in_epoch is 1: it must be 4"),
    ({"best_rsum": float("nan")}, "best_rsum is nan; it must be a finite number"),
    ({"best_rsum": float("inf")}, "best_rsum is inf; it must be a finite number"),
    ({"best_rsum": 1.5}, "best_rsum is 1.5 (best_epoch 0), but the best validation in {log} is"),
    ({"best_epoch": None}, "(best_epoch None), but the best validation in {log} is"),
    ({"epoch": 99, "global_step": 200}, "epoch is 99, but {log} has no validation of epoch 98 up to global_step 200"),
    ({"config": "x"}, "config is 'x'; it must be the run's configuration"),
    ({"optimizer": {"param_groups": "x"}}, "optimizer.param_groups is 'x'; it must be a list of 1 parameter group"),
    ({"optimizer": {"param_groups": []}}, "optimizer.param_groups is '[]'; it must be a list of 1 parameter group"),
    ({"optimizer": {"param_groups": [{"params": [0, 1]}]}}, "optimizer.param_groups[0].params is '[0, 1]'; it must "
                                                            "list the ids of this group's"),
    ({"optimizer": "scalars"}, "no optimizer state (an 'optimizer' object) in it"),
])
def test_a_trainer_state_that_disagrees_with_itself_or_the_log_is_refused(run2, capsys, fields, says):
    if "optimizer" in fields and isinstance(fields["optimizer"], dict):
        saved = json.loads((run2 / "last" / "trainer_state.json").read_text())["optimizer"]
        fields = {"optimizer": {**saved, **fields["optimizer"]}}
    path, _ = _edit_state(run2, **fields)
    kept = (run2 / "metrics.jsonl").read_bytes()
    assert resume(run2) == 2
    err = one_line(capsys)
    assert f"{path}: " in err and says.format(log=run2 / "metrics.jsonl") in err and "--overwrite" in err
    assert (run2 / "metrics.jsonl").read_bytes() == kept  # refused before the log is cut


def test_optimizer_scalars_naming_no_parameter_are_refused(run2, capsys):
    saved = json.loads((run2 / "last" / "trainer_state.json").read_text())["optimizer"]
    path, _ = _edit_state(run2, optimizer={**saved, "scalars": {"x": 1}})
    assert resume(run2) == 2
    assert f"{path}: optimizer.scalars has the key 'x'; each must be 'ID.name'" in one_line(capsys)


def test_an_edit_that_makes_sense_is_refused_by_the_checkpoints_checksums(run2, capsys):
    path, state = _edit_state(run2, elapsed=12345.0)
    assert resume(run2) == 2
    assert f"{path}: content does not match the SHA-256 recorded in {run2 / 'last' / 'checksums.json'}" in one_line(capsys)


@pytest.mark.parametrize("content", ["null", "[1, 2]"])
def test_a_trainer_state_that_is_no_object_is_named(run, capsys, content):
    path = run / "last" / "trainer_state.json"
    path.write_text(content)
    assert resume(run) == 2
    assert f"{path}: not a trainer state (a JSON object was expected)" in one_line(capsys)


def test_a_metrics_log_that_is_a_folder_is_named(run, capsys):
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    assert resume(run) == 2
    assert f"{run / 'metrics.jsonl'}: is not a file" in one_line(capsys)


def test_resume_with_another_run_dir_is_refused(run, tmp_path, capsys):
    assert resume(run, "--run-dir", str(tmp_path / "ZZ")) == 2
    err = one_line(capsys)
    assert f"--resume {run} continues the run in {run} itself; --run-dir {tmp_path / 'ZZ'} names another folder" in err
    assert not (tmp_path / "ZZ").exists()


@pytest.mark.slow  # a training killed and resumed
def test_a_kill_between_the_first_best_and_the_first_last_starts_over(small_world, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world)))
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--run-dir", str(run), "--no-progress"]) == 0
    want = json.loads((run / "best" / "metrics.json").read_text())
    shutil.rmtree(run / "last")  # as a kill after best/ of epoch 1 and before its last/ leaves it
    capsys.readouterr()
    assert resume(run) == 0
    assert "starting it over from step 1" in capsys.readouterr().err
    assert _steps(run) == [1, 2, 3]
    assert json.loads((run / "best" / "metrics.json").read_text())["rsum"] == want["rsum"]  # made again, the same


def test_a_best_of_a_later_epoch_without_last_is_refused(run, capsys):
    (run / "last").rename(run.parent / "last.gone")
    (run / "best").mkdir()
    (run / "best" / "metrics.json").write_text(json.dumps({"rsum": 50.0, "epoch": 3}))
    assert resume(run) == 2
    err = one_line(capsys)
    assert "no last/ checkpoint in it to continue from (best/ is there, of epoch 4; last/ is not)" in err
    assert (run / "best" / "metrics.json").is_file()


def test_init_from_a_checkpoint_with_a_changed_part_is_refused(run, small_world, tmp_path, capsys):
    cfg = tmp_path / "next.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world, init_from=str(run / "last"))))
    vocab = run / "last" / "vocab.json"
    vocab.write_text(vocab.read_text() + " ")  # the same words, another file: not the one saved
    assert main(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "next"), "--no-progress"]) == 2
    assert f"{vocab}: content does not match the SHA-256 recorded in" in one_line(capsys)


def test_a_last_checkpoint_without_its_seal_is_refused_on_resume(run, capsys):
    (run / "last" / "checksums.json").unlink()  # saved sealed (format 2): a part was removed since
    assert resume(run) == 2
    assert (f"{run / 'last'}: has no checksums.json, but its config.json says format 2 (saved sealed)"
            in one_line(capsys))


def test_init_from_a_checkpoint_without_its_seal_is_refused(run, small_world, tmp_path, capsys):
    cfg = tmp_path / "next.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world, init_from=str(run / "last"))))
    (run / "last" / "checksums.json").unlink()
    assert main(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "next"), "--no-progress"]) == 2
    assert (f"{run / 'last'}: has no checksums.json, but its config.json says format 2 (saved sealed)"
            in one_line(capsys))


@pytest.mark.slow  # two trainings
def test_init_from_a_checkpoint_saved_before_seals_has_its_weights_checked(run, small_world, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    last = run / "last"
    (last / "checksums.json").unlink()  # saved before vlmatch sealed checkpoints: format 1, no seal
    config = json.loads((last / "config.json").read_text())
    config.pop("format", None)
    (last / "config.json").write_text(json.dumps(config))
    weights = load_file(str(last / "model.safetensors"))
    save_file({k: v + 1 if v.is_floating_point() else v for k, v in weights.items()}, str(last / "model.safetensors"))
    cfg = tmp_path / "next.yaml"
    cfg.write_text(yaml.safe_dump(tiny(small_world, init_from=str(last))))
    assert main(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "next"), "--no-progress"]) == 2
    err = one_line(capsys)
    assert str(last / "model.safetensors") in err and "SHA-256" in err, err
