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
    state = read_json(state_file, "trainer state not found")
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


def latest_checkpoint(run_dir) -> Path | None:
    return complete_dir(Path(run_dir) / "last")
