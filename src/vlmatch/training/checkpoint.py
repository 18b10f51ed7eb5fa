"""Training checkpoints: the model folder (model.safetensors, config.json, vocab.json) plus the
optimiser in ``optimizer.safetensors`` and scalars/RNG in ``trainer_state.json``. No pickle."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ..checkpoints.read import read_config_json
from ..checkpoints.seal import seal_checkpoint, verify_checkpoint
from ..errors import DataError
from ..io import atomic_dir, complete_dir, read_json, write_bytes, write_json
from ..models.base import MatchingModel
from ..weights import verify_sha256


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"state.{pid}.{key}"] = val.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for name, val in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = val
    for name, val in meta.get("scalars", {}).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = val
    return {"state": state, "param_groups": meta["param_groups"]}


def save_training_state(path, model: MatchingModel, optimizer, trainer_state: dict) -> None:
    """Atomically write (replace) a resumable checkpoint folder (crash-safe: see vlmatch.io)."""
    with atomic_dir(path) as tmp:
        model.save(tmp)
        tensors, meta = _flatten_optimizer(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        data = safetensors_bytes(tensors)
        write_bytes(tmp / "optimizer.safetensors", data)
        write_json(tmp / "trainer_state.json", {**trainer_state, "optimizer": meta,
                                                 "optimizer_sha256": hashlib.sha256(data).hexdigest()})
        seal_checkpoint(tmp)  # the trainer state and optimiser with the model


def read_state(ckpt) -> dict:
    """``ckpt/trainer_state.json``, checked for type (:func:`check_state`): a DataError naming the file and field."""
    state_file = Path(ckpt) / "trainer_state.json"
    return check_state(state_file, read_json(state_file, "trainer state not found"))


def load_training_state(path, model: MatchingModel, optimizer) -> dict:
    d = complete_dir(path)
    if d is None:
        raise DataError(path, "no checkpoint to resume from")
    state_file = d / "trainer_state.json"
    state = read_state(d)
    _check_optimizer_meta(state_file, state["optimizer"], optimizer)
    verify_checkpoint(d)  # sealed with the model: a part edited, swapped or removed since is named
    model.load_weights(d / "model.safetensors", read_config_json(d / "config.json").get("weights_sha256"))
    verify_sha256(d / "optimizer.safetensors", state.pop("optimizer_sha256", None), state_file)
    try:
        tensors = load_file(str(d / "optimizer.safetensors"))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(d / "optimizer.safetensors", f"not a readable safetensors file: {e}") from None
    if "rng.torch" not in tensors:
        raise DataError(d / "optimizer.safetensors", "no 'rng.torch' tensor (not an optimiser state vlmatch train wrote)")
    rng = tensors.pop("rng.torch")
    meta = state.pop("optimizer")
    try:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta))
        torch.set_rng_state(rng)
    except (ValueError, TypeError, KeyError, RuntimeError, IndexError) as e:
        raise DataError(state_file, f"optimizer: the saved state does not fit this run's optimiser ({e}); restore the "
                                    "file, or start the run over with --overwrite") from None
    return state


def _check_optimizer_meta(path, meta: dict, optimizer) -> None:
    """The ``optimizer`` object of a trainer state: ``param_groups`` (one per group of this run's optimiser,
    each with as many whole-number ``params`` ids) and ``scalars`` (``"ID.name": value``)."""
    def bad(field, problem):
        return DataError(path, f"optimizer.{field} {problem} (the file was edited: restore it, or start the run over "
                               "with --overwrite)")

    groups, want = meta.get("param_groups"), optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(want):
        raise bad("param_groups", f"is {str(groups)[:40]!r}; it must be a list of {len(want)} parameter group(s)")
    for i, (g, w) in enumerate(zip(groups, want, strict=True)):
        params = g.get("params") if isinstance(g, dict) else None
        if (not isinstance(params, list) or len(params) != len(w["params"])
                or not all(isinstance(p, int) and not isinstance(p, bool) for p in params)):
            raise bad(f"param_groups[{i}].params", f"is {str(params)[:40]!r}; it must list the ids of this group's "
                                                   f"{len(w['params'])} parameters")
    ids = {p for g in groups for p in g["params"]}
    if len(ids) != sum(len(g["params"]) for g in groups):
        raise bad("param_groups", "lists a parameter id twice")
    scalars = meta.get("scalars", {})
    if not isinstance(scalars, dict):
        raise bad("scalars", f"is {str(scalars)[:40]!r}; it must be an object")
    for key in scalars:
        pid, _, name = key.partition(".")
        if not (pid.isdigit() and int(pid) in ids and name):
            raise bad("scalars", f"has the key {key[:40]!r}; each must be 'ID.name' with the id of a parameter")


# the trainer state's scalars: (types allowed, least value); None stands for "no best epoch yet"
_COUNTS = ("epoch", "step_in_epoch", "global_step")
_FIELDS = {**{k: ((int,), 0) for k in _COUNTS}, "best_rsum": ((int, float), None), "best_epoch": ((int, type(None)), 0),
           "elapsed": ((int, float), 0), "stale_epochs": ((int,), 0)}


def check_state(path, state) -> dict:
    """``trainer_state.json`` as saved: an object whose counters are whole numbers >= 0 (and
    ``optimizer`` an object); anything else (a hand edit) is a DataError naming the file and field."""
    if not isinstance(state, dict):
        raise DataError(path, "not a trainer state (a JSON object was expected)")
    for key, (types, least) in _FIELDS.items():
        if key not in state:
            if key in _COUNTS:
                raise DataError(path, f"no {key!r} field (not a trainer state vlmatch train wrote)")
            continue
        val = state[key]
        if isinstance(val, bool) or not isinstance(val, types) or (least is not None and val is not None
                                                                    and val < least):
            want = "a whole number" if types == (int,) else "a number"
            raise DataError(path, f"{key} is {val!r}; it must be {want}" + (f" >= {least}" if least is not None else "")
                            + " (the file was edited: restore it, or start the run over with --overwrite)")
    if not isinstance(state.get("optimizer"), dict):
        raise DataError(path, "no optimizer state (an 'optimizer' object) in it (the file was edited: restore it, or "
                              "start the run over with --overwrite)")
    if state.get("config") is not None and not isinstance(state["config"], dict):
        raise DataError(path, f"config is {str(state['config'])[:40]!r}; it must be the run's configuration (an object) "
                              "(the file was edited: restore it, or start the run over with --overwrite)")
    if not math.isfinite(state.get("best_rsum", 0.0)):
        raise DataError(path, f"best_rsum is {state['best_rsum']!r}; it must be a finite number (the file was edited: "
                              "restore it, or start the run over with --overwrite)")
    return state


def check_steps(path, state: dict, steps_per_epoch: list[int]) -> None:
    """Refuse a trainer state whose counters cannot come from this run: ``step_in_epoch`` past the
    end of an epoch, or a ``global_step`` other than the steps of the epochs done plus ``step_in_epoch``
    (each epoch took between one and ``max(steps_per_epoch)`` steps: the number depends on the world
    size, which may change between resumes). ``steps_per_epoch``: the run's steps per epoch at the
    world sizes it may have used (one process, and now)."""
    epoch, step, gs = state["epoch"], state["step_in_epoch"], state["global_step"]
    if step > steps_per_epoch[-1]:
        raise DataError(path, f"step_in_epoch is {step}, but an epoch of this run has {steps_per_epoch[-1]} steps "
                              "(the file was edited: restore it, or start the run over with --overwrite)")
    lo, hi = epoch + step, epoch * max(steps_per_epoch) + step
    if not lo <= gs <= hi:
        span = f"{lo}" if lo == hi else f"between {lo} and {hi}"
        raise DataError(path, f"global_step is {gs}, but epoch {epoch} and step_in_epoch {step} of this run make it "
                              f"{span} (the file was edited: restore it, or start the run over with --overwrite)")


def latest_checkpoint(run_dir) -> Path | None:
    return complete_dir(Path(run_dir) / "last")


def log_rows(path) -> list[tuple[str, dict | None]]:
    """The rows of a run's ``metrics.jsonl`` as (line, row); a last line cut short by a kill is
    (line, None). Empty when there is no log; a folder in its place, or a malformed row before the last,
    is a DataError naming the file."""
    path = Path(path)
    if not path.exists():
        return []
    if not path.is_file():
        raise DataError(path, "is not a file (the run's log, metrics.jsonl, must be one): move it away, or start "
                              "the run over with --overwrite")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines):  # torn by the kill that interrupted the run
                rows.append((line, None))
                continue
            row = None
        step = row.get("global_step", 0) if isinstance(row, dict) else None
        if not isinstance(step, int):
            raise DataError(path, f"line {no} is not a row vlmatch train wrote (not a JSON object with an integer "
                                  "global_step): restore the file or start the run over with --overwrite")
        rows.append((line, row))
    return rows


def check_log(path, state: dict, metrics_path) -> None:
    """Refuse a trainer state that disagrees with the run's log (``metrics.jsonl``, whose rows are written
    before the checkpoint of their step): ``global_step`` must be where the log ends the last finished epoch
    plus ``step_in_epoch``, and ``best_rsum`` / ``best_epoch`` the best validation row up to it. A DataError
    names the file and field. Nothing to compare without a log."""
    rows = [r for _, r in log_rows(metrics_path) if r is not None and r["global_step"] <= state["global_step"]]
    if not Path(metrics_path).is_file():
        return
    edited = "(the file was edited: restore it, or start the run over with --overwrite)"
    epoch, step, gs = state["epoch"], state["step_in_epoch"], state["global_step"]
    val = [r for r in rows if r.get("type") == "val" and isinstance(r.get("rsum"), (int, float))]
    start = 0
    if epoch > 0:
        ends = [r for r in val if r.get("epoch") == epoch - 1]
        if not ends:
            raise DataError(path, f"epoch is {epoch}, but {metrics_path} has no validation of epoch {epoch - 1} up to "
                                  f"global_step {gs}: the run never finished that epoch {edited}")
        start = ends[-1]["global_step"]
    if gs != start + step:
        raise DataError(path, f"global_step is {gs}, but {metrics_path} ends epoch {epoch - 1} at step {start} and "
                              f"step_in_epoch is {step}: it must be {start + step} {edited}")
    best = max(val, key=lambda r: r["rsum"], default=None)  # the first of equals, as the trainer keeps it
    if best is None:
        if state.get("best_epoch") is not None:
            raise DataError(path, f"best_epoch is {state['best_epoch']}, but {metrics_path} has no validation row "
                                  f"up to global_step {gs} {edited}")
        return
    if abs(state["best_rsum"] - best["rsum"]) > 1e-9 or state.get("best_epoch") != best.get("epoch"):
        raise DataError(path, f"best_rsum is {state['best_rsum']!r} (best_epoch {state.get('best_epoch')}), but the "
                              f"best validation in {metrics_path} is {best['rsum']!r} at epoch {best.get('epoch')} "
                              f"{edited}")
