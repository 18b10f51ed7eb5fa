"""Training checkpoints: the model folder (model.safetensors, config.json, vocab.json) plus the
optimiser in ``optimizer.safetensors`` and scalars/RNG in ``trainer_state.json``. No pickle."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ..errors import DataError
from ..io import atomic_dir, complete_dir, read_json, write_bytes, write_json
from ..models.base import MatchingModel, read_config_json
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


def load_training_state(path, model: MatchingModel, optimizer) -> dict:
    d = complete_dir(path)
    if d is None:
        raise DataError(path, "no checkpoint to resume from")
    state_file = d / "trainer_state.json"
    state = check_state(state_file, read_json(state_file, "trainer state not found"))
    model.load_weights(d / "model.safetensors", read_config_json(d / "config.json").get("weights_sha256"))
    verify_sha256(d / "optimizer.safetensors", state.pop("optimizer_sha256", None), state_file)
    try:
        tensors = load_file(str(d / "optimizer.safetensors"))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(d / "optimizer.safetensors", f"not a readable safetensors file: {e}") from None
    rng = tensors.pop("rng.torch")
    optimizer.load_state_dict(_unflatten_optimizer(tensors, state.pop("optimizer")))
    torch.set_rng_state(rng)
    return state


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
        raise DataError(path, "no optimizer state (an 'optimizer' object) in it")
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
