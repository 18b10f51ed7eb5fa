"""Training: learning on the toy world, exact resume, 2-process torchrun, run-folder contents."""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from vlmatch import load_model
from vlmatch.data.precomp import PrecompSplit
from vlmatch.training.config import load_config
from vlmatch.training.loop import train, validate


def _cfg(world, **train_over):
    extra = {"model": {"name": "vsepp", "embed_dim": 64, "word_dim": 32},
             "data": {"path": str(world), "val_max_images": 200, "min_word_count": 1},
             "train": {"epochs": 2, "batch_size": 64, "lr": 1e-3, "lr_update": 10, "log_every": 1,
                       "warmup_epochs": 1, "threads": 1, **train_over}}
    return load_config(None, extra=extra)


def _log(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _losses(run):
    return [r["loss"] for r in _log(run) if r["type"] == "train"]


@pytest.mark.slow  # three trainings of two epochs
def test_resume_after_a_kill_mid_epoch_replays_the_same_losses(small_world, tmp_path):
    full = tmp_path / "full"
    train(_cfg(small_world), full, progress=False)
    cut = tmp_path / "cut"
    # checkpoint every 4 steps, die at step 11 (mid-epoch 0, after the step-8 checkpoint)
    train(_cfg(small_world, checkpoint_every_steps=4, stop_after_steps=11), cut, progress=False)
    state = json.loads((cut / "last" / "trainer_state.json").read_text())
    assert state["global_step"] == 8 and state["epoch"] == 0
    cfg = _cfg(small_world, checkpoint_every_steps=4)
    train(cfg, cut, resume=True, progress=False)
    a, b = _losses(full), _losses(cut)
    assert len(a) == len(b) == 2 * 47  # 3000 captions / 64 per batch, 2 epochs
    assert a == b  # bit-identical loss sequence
    times = [r["time"] for r in _log(cut) if r["type"] == "train"]
    assert all(t1 <= t2 for t1, t2 in itertools.pairwise(times))  # the clock runs on across the resume
    wa = load_model(full / "last").state_dict()
    wb = load_model(cut / "last").state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow  # two torchrun processes: ~10 s of startup and gloo on a loaded 2-core machine
def test_torchrun_two_processes_end_with_identical_weights(small_world, tmp_path):
    cfg_path = tmp_path / "c.yaml"
    import yaml

    cfg = _cfg(small_world, epochs=1, max_steps_per_epoch=6, log_every=2)
    cfg["model"] = {"name": "scan_t2i_avg", "embed_dim": 32, "word_dim": 16}  # several image blocks to shard
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "vlmatch.cli", "train", "--config", str(cfg_path), "--run-dir", str(run),
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((run / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    assert [s["global_step"] for s in _log(run) if s["type"] == "train"] == [2, 4, 6]  # rank 0 logs alone
    assert (run / "best" / "model.safetensors").is_file()
    # validation was sharded over both ranks: it equals one process validating the saved model
    (val,) = [r for r in _log(run) if r["type"] == "val"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank ran
    try:
        alone = validate(load_model(run / "best"), PrecompSplit(small_world, "dev", max_images=200), "cpu")
    finally:
        torch.set_num_threads(threads)
    assert val["rsum"] == alone["rsum"] and val["i2t_r1"] == alone["i2t_r1"]


def test_adadelta_weight_decay_and_an_explicit_lr_schedule(small_world, tmp_path):
    """SMAN's schedule in small: Adadelta (ρ 0.9), weight decay, lr 0.05 then 0.005 from epoch 1."""
    import pytest

    from vlmatch.errors import ConfigError
    from vlmatch.training.loop import lr_at

    run = tmp_path / "ada"
    cfg = _cfg(small_world, optimizer="adadelta", weight_decay=5e-4, lr_schedule=[[0, 0.05], [1, 0.005]],
               max_steps_per_epoch=3, grad_clip=0.1)
    train(cfg, run, progress=False)
    lrs = {r["epoch"]: r["lr"] for r in _log(run) if r["type"] == "train"}
    assert lrs == {0: 0.05, 1: 0.005}
    group = json.loads((run / "last" / "trainer_state.json").read_text())["optimizer"]["param_groups"][0]
    assert group["rho"] == 0.9 and group["weight_decay"] == 5e-4 and group["lr"] == 0.005
    assert [lr_at(cfg["train"], e) for e in (0, 1, 7)] == [0.05, 0.005, 0.005]
    assert lr_at(_cfg(small_world, lr=0.1, lr_update=2)["train"], 3) == pytest.approx(0.01)  # step decay otherwise
    with pytest.raises(ConfigError, match="increasing from 0"):
        _cfg(small_world, lr_schedule=[[5, 0.1]])
    with pytest.raises(ConfigError, match="train.optimizer must be one of adam, adadelta"):
        _cfg(small_world, optimizer="sgd")


def test_patience_stops_when_val_rsum_stops_improving_but_not_before_min_epochs(small_world, tmp_path):
    """lr 1e-12 moves no float32 weight, so val rsum never improves after the first epoch."""
    cfg = _cfg(small_world, epochs=6, lr=1e-12, patience=1, min_epochs=3, max_steps_per_epoch=2)
    train(cfg, tmp_path / "run", progress=False)
    vals = [r for r in _log(tmp_path / "run") if r["type"] == "val"]
    assert len(vals) == 3 and len({r["rsum"] for r in vals}) == 1  # stale since epoch 1, kept to min_epochs
    state = json.loads((tmp_path / "run" / "last" / "trainer_state.json").read_text())
    assert state["epoch"] == 3 and state["stale_epochs"] == 2


@pytest.mark.slow  # a training with a transformer text side
def test_a_frozen_transformer_text_side_trains_without_a_vocabulary(small_world, tmp_path):
    """text_encoder = a local HF folder: no vocab.json, the tokenizer kept, outputs prefilled into the cache."""
    from tests.encoders.tiny_bert import tiny_bert_folder

    from ..models.test_mmca import toy_words

    bert = tiny_bert_folder(tmp_path / "bert", hidden=24, layers=2, heads=2, words=toy_words())
    cfg = _cfg(small_world, epochs=1, max_steps_per_epoch=3)
    cfg["model"] = {"name": "scan_t2i_avg", "embed_dim": 16, "text_encoder": str(bert)}
    best = train(cfg, tmp_path / "run", progress=False)
    assert best["rsum"] > 0
    run = tmp_path / "run"
    assert not (run / "best" / "vocab.json").exists() and (run / "best" / "tokenizer" / "vocab.txt").is_file()
    model = load_model(run / "best")
    assert model.pretrained_text is not None and not model.uses_vocab
    cache = model.pretrained_text.hf.output_cache()
    captions = PrecompSplit(small_world, "train").captions + PrecompSplit(small_world, "dev", max_images=200).captions
    tokens, lengths = model.tokenize(captions)
    distinct = {tuple(row[:n].tolist()) for row, n in zip(tokens, lengths.tolist(), strict=True)}
    assert len(cache) == len(distinct) > 3900  # every caption of both splits, each token sequence once


def test_runs_made_before_a_default_changed_go_on_with_their_own_equations(small_world, tmp_path, monkeypatch):
    """MTFN's input_norm default moved from l2 to none. A run whose config left it to the default and whose
    checkpoint predates the option (its config.json lacks the key) resumes with l2, what it was made with;
    a new run continuing from that checkpoint (train.init_from) must say which it means."""
    from vlmatch.errors import ConfigError
    from vlmatch.models import registry

    def cfg(**model):
        return load_config(None, extra={
            "model": {"name": "mtfn", "embed_dim": 16, "word_dim": 8, "rank": 2, "fusion_dim": 8, **model},
            "data": {"path": str(small_world), "val_max_images": 100, "min_word_count": 1},
            "train": {"epochs": 2, "batch_size": 32, "max_steps_per_epoch": 2, "log_every": 1, "threads": 1,
                      "checkpoint_every_steps": 1}})

    old = tmp_path / "old"
    with monkeypatch.context() as m:  # the registered default as it was when the run began
        cls, _, description = registry._entry("mtfn")
        m.setitem(registry._REGISTRY, "mtfn", (cls, {"input_norm": "l2"}, description))
        c = cfg()
        c["train"]["stop_after_steps"] = 1
        train(c, old, progress=False)
    made = json.loads((old / "last" / "config.json").read_text())
    assert made["config"].pop("input_norm") == "l2"  # now as a checkpoint from before the option
    made.pop("format", None)  # as saved then: before config.json recorded its format
    (old / "last" / "config.json").write_text(json.dumps(made))
    (old / "last" / "checksums.json").unlink()  # as saved then: before checkpoints were sealed
    assert load_model(old / "last").cfg.input_norm == "l2"  # the loader's rule
    train(cfg(), old, resume=True, progress=False)
    assert load_model(old / "last").cfg.input_norm == "l2"  # resumed with its own equations
    assert json.loads((old / "last" / "trainer_state.json").read_text())["global_step"] == 4
    with pytest.raises(ConfigError, match=r"model.input_norm: 'l2' in .*config.json, 'none' now"):
        train({**cfg(), "train": {**cfg()["train"], "init_from": str(old / "last")}}, tmp_path / "next", progress=False)
    nxt = cfg(input_norm="l2")
    nxt["train"]["init_from"] = str(old / "last")
    train(nxt, tmp_path / "next", progress=False)
    assert load_model(tmp_path / "next" / "last").cfg.input_norm == "l2"
