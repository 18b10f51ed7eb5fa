"""`vlmatch plot` and the curves a training run draws: the x axis, the best marker, the PNG."""

import json

import numpy as np
import pytest
from PIL import Image

from vlmatch.cli import main
from vlmatch.errors import DataError
from vlmatch.training.config import load_config
from vlmatch.training.loop import train
from vlmatch.viz.curves import epoch_positions, plot_runs, run_curves


def _run(world, run, epochs=2, **train_over):
    cfg = load_config(None, extra={
        "model": {"name": "vsepp", "embed_dim": 16, "word_dim": 8},
        "data": {"path": str(world), "val_max_images": 50, "min_word_count": 1},
        "train": {"epochs": epochs, "batch_size": 64, "max_steps_per_epoch": 4, "log_every": 1, "threads": 1,
                  "warmup_epochs": 1, **train_over}})
    train(cfg, run, progress=False)
    return run


@pytest.fixture(scope="module")
def runs(small_world, tmp_path_factory):
    base = tmp_path_factory.mktemp("plot")
    return _run(small_world, base / "a"), _run(small_world, base / "b", epochs=3, lr=1e-3)


def test_x_axis_counts_epochs_completed():
    train = [{"epoch": e, "step": s, "global_step": 4 * e + s, "loss": 1.0} for e in range(2) for s in (2, 4)]
    gs, x = epoch_positions(train)
    np.testing.assert_allclose(x, [0.5, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(gs, [2, 4, 6, 8])


@pytest.mark.slow  # a training
def test_run_curves_put_validations_at_epoch_ends_and_mark_the_switch_to_hardest(runs):
    c = run_curves(runs[1])
    np.testing.assert_allclose(c["val_x"], [1.0, 2.0, 3.0])  # the val after "epoch": 0 is after 1 epoch
    assert c["hardest_from"] == 1.0  # one warm-up epoch, then hardest negatives
    log = [json.loads(ln) for ln in (runs[1] / "metrics.jsonl").read_text().splitlines()]
    assert list(c["val"]["rsum"]) == [r["rsum"] for r in log if r["type"] == "val"]
    assert len(c["loss"]) == 12 and c["x"][-1] == 3.0


def test_plot_of_two_runs_writes_a_png(runs, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert main(["plot", str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (1200, 800)
        assert np.asarray(im.convert("L")).std() > 10  # lines and text, not a blank canvas


@pytest.mark.slow  # a training
def test_vlmatch_train_draws_curves_and_shows_epochs_from_1(small_world, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: vsepp, embed_dim: 16, word_dim: 8}}\n"
                   f"data: {{path: {small_world}, val_max_images: 50, min_word_count: 1}}\n"
                   f"train: {{epochs: 2, batch_size: 64, max_steps_per_epoch: 2, threads: 1}}\n")
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--run-dir", str(run), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "[val] epoch 1/2 " in err and "[val] epoch 2/2 " in err and "[val] epoch 0" not in err
    assert (run / "curves.png").stat().st_size > 10_000 and f"curves:     {run / 'curves.png'}" in out
    assert "best-on-validation checkpoint" in out
    assert f"vlmatch evaluate --checkpoint {run / 'best'} --data {small_world} --split test" in out


def test_plot_errors_name_the_fix(runs, tmp_path):
    with pytest.raises(DataError, match=r"a checkpoint folder; plot reads the run folder around it: .*/a$"):
        plot_runs([runs[0] / "best"], tmp_path / "x.png")
    with pytest.raises(DataError, match="metrics.jsonl: not found"):
        plot_runs([tmp_path], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    torn = tmp_path / "torn"  # a last line still being written is passed over; a broken one before it is named
    torn.mkdir()
    rows = (runs[0] / "metrics.jsonl").read_text().splitlines()
    (torn / "metrics.jsonl").write_text("\n".join([*rows, '{"type": "tr']))
    assert plot_runs([torn], tmp_path / "x.png")
    (torn / "metrics.jsonl").write_text("\n".join(["{oops", *rows]))
    with pytest.raises(DataError, match="metrics.jsonl: line 1 is not a row vlmatch train wrote"):
        plot_runs([torn], tmp_path / "y.png")
