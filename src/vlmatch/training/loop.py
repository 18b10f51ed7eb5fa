"""The training loop: optimiser, lr schedule, gradient clipping, validation, checkpoints, exact resume, DDP.

Data order is a pure function of (seed, epoch), so a resumed run replays the same batches from the saved step.
Under torchrun each rank takes every world_size-th item; hardest negatives are mined within each rank's batch.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import distributed as D
from ..checkpoints.read import load_training_state, read_config_json, read_state, verify_sealed
from ..checkpoints.seal import seal_checkpoint
from ..checkpoints.write import save_training_state
from ..data.loaders import batch_kind, encode_captions
from ..data.precomp import PrecompSplit
from ..data.resolve import resolve_data
from ..data.vocab import Vocab
from ..distributed import pick_device
from ..encoders.hf import HFTextEncoder
from ..errors import ConfigError
from ..evaluation.validate import validate
from ..io import append_line, atomic_dir, write_json, write_text
from ..models.registry import create_model, legacy_conflicts, model_class, saved_options
from .allocator import keep_freed_memory
from .config import check_config, dump
from .grounding import GroundingTargets, check_grounding_map, grounding_term
from .rundir import (
    check_log,
    check_resume,
    check_steps,
    latest_checkpoint,
    log_rows,
    prepare_fresh,
    recorded,
    run_lock,
    start_over,
)


def param_groups(model: torch.nn.Module, tc: dict) -> list[dict]:
    """The trained parameters as the optimizer's groups: one, or with ``train.pretrained_lr_scale`` != 1 a second
    for the fine-tuned ``HFTextEncoder`` parameters, whose ``lr_scale`` multiplies the epoch's lr."""
    trained = [p for p in model.parameters() if p.requires_grad]
    scale = float(tc.get("pretrained_lr_scale", 1.0))
    pretrained = {id(p) for m in model.modules() if isinstance(m, HFTextEncoder) for p in m.parameters()}
    inner = [p for p in trained if id(p) in pretrained]
    if scale == 1.0 or not inner:  # (one group: the optimizer states of earlier runs resume unchanged)
        return [{"params": trained, "lr_scale": 1.0}]
    return [{"params": [p for p in trained if id(p) not in pretrained], "lr_scale": 1.0},
            {"params": inner, "lr_scale": scale}]


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The epoch's lr on every group, times the group's ``lr_scale``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def make_optimizer(params, tc: dict) -> torch.optim.Optimizer:
    """``train.optimizer``: adam (torch's fused kernel where the device has one), or adadelta with ρ = 0.9 (SMAN's
    "Adadelta, momentum 0.9"); ``train.weight_decay`` is torch's L2 ``weight_decay``."""
    if tc["optimizer"] == "adadelta":
        return torch.optim.Adadelta(params, lr=lr_at(tc, 0), rho=0.9, weight_decay=tc["weight_decay"], foreach=True)
    params = list(params)
    try:  # one pass over each parameter instead of ~10 (torch >= 2.4 has it on the CPU too)
        return torch.optim.Adam(params, lr=lr_at(tc, 0), weight_decay=tc["weight_decay"], fused=True)
    except (RuntimeError, ValueError, TypeError):  # a device or dtype without the fused kernel
        return torch.optim.Adam(params, lr=lr_at(tc, 0), weight_decay=tc["weight_decay"])


def lr_at(tc: dict, epoch: int) -> float:
    """The lr of ``epoch``: ``train.lr_schedule`` (piecewise constant) when given, else ``train.lr`` x
    ``train.lr_decay`` every ``train.lr_update`` epochs."""
    if tc.get("lr_schedule"):
        return float([lr for start, lr in tc["lr_schedule"] if start <= epoch][-1])
    return tc["lr"] * (tc.get("lr_decay", 0.1) ** (epoch // tc["lr_update"]))


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(cfg: dict, run_dir, resume: bool = False, progress: bool = True, overwrite: bool = False) -> dict:
    """Train per ``cfg`` into ``run_dir`` (a fresh run, or ``resume`` from ``run_dir/last``, under the folder's
    lock: :mod:`vlmatch.training.rundir`); returns the best validation metrics."""
    cfg = check_config(cfg)
    rank = D.world()[0] if D.world()[1] > 1 else D.world_from_env()[0]
    with run_lock(run_dir, resume) if rank == 0 else nullcontext():
        return _train(cfg, Path(run_dir), resume, progress, overwrite)


@dataclass(frozen=True)
class _Run:
    """What the steps of one training run share: its settings, folder, device and place among the ranks."""
    tc: dict
    run_dir: Path
    device: torch.device
    rank: int
    world_size: int
    progress: bool  # progress bars asked for

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shows_progress(self) -> bool:
        """Progress bars: asked for, and this is the main process."""
        return self.progress and self.is_main

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


def _train(cfg: dict, run_dir: Path, resume: bool, progress: bool, overwrite: bool) -> dict:
    tc, dc = cfg["train"], cfg["data"]
    run = _start(tc, run_dir, progress)
    torch.manual_seed(tc["seed"])
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        resume, overwrite = start_over(run_dir), True  # killed before its first checkpoint: nothing to continue
    if resume:
        check_resume(read_state(ckpt).get("config"), cfg, run_dir)
    if not resume and run.is_main:
        prepare_fresh(run_dir, overwrite)

    train_split, val_split = _splits(dc, run)
    model = _model(cfg, train_split, ckpt)
    kind = batch_kind(model.begin_stage(tc["stage"]))  # the model says what its stage trains on
    model.to(run.device)
    optimizer = make_optimizer(param_groups(model, tc), tc)
    if dc["mirror"] > 0 and kind is not batch_kind("image_caption"):
        raise ConfigError("data.mirror shows images their mirror view: this stage trains on caption pairs")
    # the model tokenises its own captions
    dataset = kind.dataset(train_split, model, **({"mirror": dc["mirror"]} if dc["mirror"] > 0 else {}))
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best_rsum": -1.0, "best_epoch": None, "elapsed": 0.0}
    if resume:
        state = _resumed_state(run, ckpt, model, optimizer, len(dataset))
    state["config"] = recorded(cfg)  # saved in every checkpoint; a resume is checked against it
    if run.is_main:
        write_text(run_dir / "config.yaml", dump(state["config"]))
    D.barrier()

    net = DistributedDataParallel(model) if run.world_size > 1 else model
    # a frozen cached text encoder runs once per caption of both splits, here, in large batches
    model.prepare_captions(dataset.tokens, progress=run.shows_progress)
    model.prepare_captions(encode_captions(val_split, model), progress=run.shows_progress)
    grounding = None
    if tc["grounding_loss"] > 0:  # phrase boxes of the train captions (val's are never read)
        if kind is not batch_kind("image_caption"):
            raise ConfigError("train.grounding_loss trains on (image, caption) batches: this stage trains on others")
        check_grounding_map(model, tc["grounding_map"])
        grounding = GroundingTargets(train_split, model, dc["entities"], progress=run.shows_progress)
    compiled = compiled_score(model) if tc["compile"] else None
    t_start = time.time() - state.get("elapsed", 0.0)  # the log's "time" runs on across a resume
    for epoch in range(state["epoch"], tc["epochs"]):
        lr = lr_at(tc, epoch)
        set_lr(optimizer, lr)
        batches = _epoch_plan(len(dataset), tc, epoch, run.rank, run.world_size)
        start = state["step_in_epoch"]
        if hasattr(dataset, "set_epoch"):  # e.g. caption pairs drawn afresh each epoch
            dataset.set_epoch(tc["seed"], epoch)
        # one iterator, shared by tqdm.auto (which takes its own at construction: a second set of workers)
        loader = iter(DataLoader(dataset, batch_sampler=batches[start:], collate_fn=kind.collate,
                                 num_workers=tc["workers"]))
        hardest = tc["max_violation"] and epoch >= tc["warmup_epochs"]
        # on screen epochs count from 1 ("epoch 1/7" is the first); metrics.jsonl keeps the 0-based index
        bar = tqdm(loader, total=len(batches), initial=start, desc=f"epoch {epoch + 1}/{tc['epochs']}",
                   disable=not run.shows_progress, leave=False)
        model.train()
        if compiled is not None:
            model.score = compiled  # the training steps' score; _validate_and_keep scores eagerly
        try:
            for step, batch in enumerate(bar, start=start):
                inputs = kind.inputs(batch, run.device)
                loss, ground = _step(model, net, optimizer, batch, inputs, tc=tc, hardest=hardest, grounding=grounding)
                state["global_step"] += 1
                state["step_in_epoch"] = step + 1
                gs, inside = state["global_step"], step + 1 < len(batches)
                if run.is_main and (gs % tc["log_every"] == 0 or not inside):
                    bar.set_postfix(loss=f"{loss.item():.3f}")
                    row = {"type": "train", "epoch": epoch, "step": step + 1, "global_step": gs, "loss": loss.item(),
                           "lr": lr, **({} if ground is None else {"grounding": ground.item()}), "hardest": hardest,
                           "time": time.time() - t_start}
                    append_line(run.metrics_path, json.dumps(row))
                if tc["val_every_steps"] and gs % tc["val_every_steps"] == 0 and inside:
                    _validate_and_keep(model, val_split, state, run=run, epoch=epoch)
                if tc["checkpoint_every_steps"] and gs % tc["checkpoint_every_steps"] == 0 and inside:
                    _save_last(run, model, optimizer, state, t_start)
                if tc["stop_after_steps"] and gs >= tc["stop_after_steps"]:
                    D.shutdown()
                    return {"stopped_at": gs}
        finally:  # a failed step too: the workers end with it, not at a garbage collection of its traceback
            bar.close()
            if hasattr(loader, "_shutdown_workers"):  # (torch's multi-process iterator has no public close)
                loader._shutdown_workers()
        state["epoch"], state["step_in_epoch"] = epoch + 1, 0
        best_before = state["best_rsum"]
        _validate_and_keep(model, val_split, state, run=run, epoch=epoch)
        # epochs since val rsum last improved (every rank knows the broadcast best, so all stop together)
        state["stale_epochs"] = 0 if state["best_rsum"] > best_before else state.get("stale_epochs", 0) + 1
        _save_last(run, model, optimizer, state, t_start)
        if tc["patience"] and epoch + 1 >= tc["min_epochs"] and state["stale_epochs"] >= tc["patience"]:
            if run.is_main:
                print(f"[stop] val rsum has not improved for {state['stale_epochs']} epochs (train.patience="
                      f"{tc['patience']}): stopping after epoch {epoch + 1}/{tc['epochs']}", file=sys.stderr)
            break

    if run.world_size > 1:
        write_json(run_dir / "ranks" / f"rank{run.rank}.json", {"rank": run.rank, "weights_sha256": weights_digest(model)})
    D.barrier()
    D.shutdown()
    best = run_dir / "best" / "metrics.json"
    return json.loads(best.read_text()) if best.is_file() else {}


def _start(tc: dict, run_dir: Path, progress: bool) -> _Run:
    """Set up this process for the run (threads, allocator, device, process group): the run's :class:`_Run`."""
    device = pick_device(tc["device"])
    if tc["threads"]:
        torch.set_num_threads(int(tc["threads"]))
    if tc["reuse_freed_memory"]:
        keep_freed_memory()
    device = D.setup(device)
    rank, world_size = D.world()
    return _Run(tc=tc, run_dir=run_dir, device=device, rank=rank, world_size=world_size, progress=progress)


def _splits(dc: dict, run: _Run) -> tuple[PrecompSplit, PrecompSplit]:
    """The train split (less the images naming ``data.exclude_words``) and the validation split."""
    root = resolve_data(dc["path"])
    train_split = PrecompSplit(root, dc["train_split"])
    if dc.get("exclude_words"):
        hold_out(train_split, dc["exclude_words"], log=run.is_main)
    val_split = PrecompSplit(root, dc["val_split"], max_images=dc["val_max_images"])
    if dc["check_finite"]:  # once, up front, rather than when a bad batch comes up
        for sp in (train_split, val_split):
            sp.check_all_finite(progress=run.shows_progress)
    return train_split, val_split


def _model(cfg: dict, train_split: PrecompSplit, ckpt: Path | None):
    """The model to train: its vocabulary (a resumed run's, the previous stage's, or built), a checkpoint's values of
    options whose default changed, and ``train.init_from``'s weights."""
    tc = cfg["train"]
    model_opts = {k: v for k, v in cfg["model"].items() if k != "name"}
    vocab = None
    if model_class(cfg["model"]["name"]).needs_vocab(cfg["model"]):
        # a resumed run keeps the vocabulary it was trained with
        init_vocab = Path(tc["init_from"]) / "vocab.json" if tc["init_from"] else None
        if ckpt is not None:
            vocab = Vocab.load(ckpt / "vocab.json")
        elif init_vocab is not None and init_vocab.is_file():  # the previous stage's vocabulary
            vocab = Vocab.load(init_vocab)
        elif cfg["data"]["vocab"]:
            vocab = Vocab.load(cfg["data"]["vocab"])
        else:
            vocab = Vocab.build(train_split.captions, min_count=cfg["data"]["min_word_count"])
        model_opts["vocab_size"] = len(vocab)
    if ckpt is not None:  # an option whose default changed since: the run goes on with its checkpoint's value
        made = saved_options(ckpt)
        for key in model_class(cfg["model"]["name"]).legacy_options:
            if key not in model_opts and key in made:
                model_opts[key] = made[key]
    model_opts.setdefault("img_dim", train_split.img_dim)
    if model_opts["img_dim"] != train_split.img_dim:
        raise ConfigError(f"model.img_dim={model_opts['img_dim']} but {train_split.features_path} has "
                          f"{train_split.img_dim}-d features")
    model = create_model(cfg["model"]["name"], **model_opts)
    model.vocab = vocab
    if tc["init_from"]:
        conflicts = legacy_conflicts(model, tc["init_from"])
        if conflicts:
            raise ConfigError(f"train.init_from: the checkpoint was made with other values of options whose default "
                              f"changed: {'; '.join(conflicts)}. Set them in the config's model section (--set "
                              f"model.KEY=VALUE) to continue from it with its own equations")
        init = Path(tc["init_from"])
        verify_sealed(init)  # the folder whole, then its weights against config.json's digest
        model.load_weights(init / "model.safetensors", read_config_json(init / "config.json").get("weights_sha256"))
    return model


def _resumed_state(run: _Run, ckpt: Path, model, optimizer, n_items: int) -> dict:
    """The trainer state of ``ckpt``, checked against this run and its log, loaded into ``model`` and ``optimizer``;
    the log cut back to its step."""
    saved = read_state(ckpt)
    check_steps(ckpt / "trainer_state.json", saved, [len(_epoch_plan(n_items, run.tc, 0, 0, w))
                                                     for w in (1, run.world_size)])
    check_log(ckpt / "trainer_state.json", saved, run.metrics_path)
    state = load_training_state(ckpt, model, optimizer)
    if run.is_main:
        _truncate_log(run.metrics_path, state["global_step"])
    return state


def _step(model, net, optimizer, batch, inputs, *, tc: dict, hardest: bool, grounding):
    """One optimisation step on ``batch``: (the loss, the grounding term or None)."""
    with model.shared_encodings():  # the grounding term reuses the matching pass's encodings
        scores = net(*inputs)
        loss = model.loss(scores, batch, tc, hardest)  # the model's own objective (default: hinge triplet)
        ground = None
        if grounding is not None:
            ground = grounding_term(model, grounding, batch, inputs, tc["grounding_temperature"],
                                    tc["grounding_form"], kind=tc["grounding_map"])
            loss = loss + tc["grounding_loss"] * ground
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if tc["grad_clip"] and tc["grad_clip"] > 0:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], tc["grad_clip"])
    optimizer.step()
    return loss, ground


def _save_last(run: _Run, model, optimizer, state: dict, t_start: float) -> None:
    """The run as it stands in last/ (by the main process; every rank waits for it)."""
    if run.is_main:
        state["elapsed"] = time.time() - t_start
        save_training_state(run.run_dir / "last", model, optimizer, state)
    D.barrier()


def _epoch_plan(n: int, tc: dict, epoch: int, rank: int, world_size: int) -> list[list[int]]:
    """The epoch's batches, capped at ``train.max_steps_per_epoch``; each rank an equal share of one permutation."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(tc["seed"] * 1_000_003 + epoch)).tolist()
    per_rank, step = n // world_size, tc["batch_size"]
    mine = perm[rank * per_rank:(rank + 1) * per_rank] if world_size > 1 else perm
    return [mine[i:i + step] for i in range(0, len(mine), step)][:tc["max_steps_per_epoch"] or None]


def compiled_score(model):
    """``train.compile``: the model's pair score through torch.compile (dynamic shapes). Where it fails, or gives
    non-finite scores the eager score keeps finite (a wrong cached kernel), the run falls back to eager with a note."""
    eager = model.score
    compiled = torch.compile(eager, dynamic=True)
    failed = []

    def fall_back(e: Exception) -> None:
        failed.append(e)
        print(f"vlmatch: note: train.compile: torch.compile failed for {type(model).__name__} "
              f"({type(e).__name__}: {str(e).splitlines()[0][:120]}); training on eagerly", file=sys.stderr)

    def score(img, txt):
        if not failed:
            try:
                out = compiled(img, txt)
            except Exception as e:  # noqa: BLE001 -- torch's compiler errors have no common public base
                fall_back(e)
            else:
                if bool(torch.isfinite(out).all()):
                    return out
                ref = eager(img, txt)
                if not bool(torch.isfinite(ref).all()):
                    return out  # the model itself gives non-finite scores: not the compiler's doing
                fall_back(FloatingPointError("compiled scores are non-finite where the eager ones are finite"))
                return ref
        return eager(img, txt)

    score.failed = failed
    return score


def _validate_and_keep(model, val_split: PrecompSplit, state: dict, *, run: _Run, epoch: int) -> None:
    """Validate, log the row, keep best/ when the rsum is the best so far, and tell every rank the best."""
    t0 = time.perf_counter()
    # train.compile: validation scores through the engine's own compiled path (fixed block shapes, no grad)
    compiled = model.__dict__.pop("score", None)
    try:
        m = validate(model, val_split, run.device, progress=run.shows_progress, top_k=run.tc["val_top_k"],
                     compile=compiled is not None)
    finally:
        if compiled is not None:
            model.score = compiled
    if run.is_main:
        append_line(run.metrics_path, json.dumps({"type": "val", "epoch": epoch, "global_step": state["global_step"],
                                                  "seconds": time.perf_counter() - t0,
                                                  **{k: v for k, v in m.items() if k != "protocol"}}))
        if m["rsum"] > state["best_rsum"]:
            state["best_rsum"], state["best_epoch"] = m["rsum"], epoch
            with atomic_dir(run.run_dir / "best") as tmp:
                model.save(tmp)
                write_json(tmp / "metrics.json", {**m, "epoch": epoch, "global_step": state["global_step"]})
                seal_checkpoint(tmp)
        # on screen epochs count from 1, as on the progress bar; the files keep the 0-based index
        print(f"[val] epoch {epoch + 1}/{run.tc['epochs']} step {state['global_step']}: rsum {m['rsum']:.1f} "
              f"(i2t R@1 {m['i2t_r1']:.1f}, t2i R@1 {m['t2i_r1']:.1f})", file=sys.stderr)
    D.barrier()
    # every rank must know the best so far (it is saved in every rank's trainer state)
    if run.world_size > 1:
        t = torch.tensor([state["best_rsum"]], dtype=torch.float64,
                         device=run.device if torch.distributed.get_backend() == "nccl" else "cpu")
        torch.distributed.broadcast(t, 0)
        state["best_rsum"] = float(t.item())


def _truncate_log(path: Path, global_step: int) -> None:
    """Drop log lines written after the checkpoint we resume from (a line torn by the kill among them)."""
    if not path.exists():
        return
    keep = [line for line, row in log_rows(path) if row is not None and row["global_step"] <= global_step]
    write_text(path, "".join(line + "\n" for line in keep))


def hold_out(split: PrecompSplit, words: list[str], log: bool = True) -> None:
    """Drop the train images whose captions name one of ``words`` (data.exclude_words)."""
    from ..data.heldout import images_naming

    named = images_naming(split.captions, split.per_image, words)
    keep = [not n for n in named]
    if not any(keep):
        raise ConfigError(f"data.exclude_words leaves no train image of {split.features_path}")
    split.keep_images(keep)
    if log:
        print(f"data.exclude_words: {len(keep) - sum(keep)} of {len(keep)} train images left out "
              f"({len(words)} words); training on {sum(keep)}", file=sys.stderr)
