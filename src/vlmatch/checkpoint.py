"""Training checkpoints: the model folder (model.safetensors, config.json, vocab.json) plus the
optimiser in ``optimizer.safetensors`` and scalars/RNG in ``trainer_state.json``. No pickle."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .errors import DataError
from .io import atomic_dir, complete_dir, write_json
from .models.base import MatchingModel


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
    """Atomically write (replace) a resumable checkpoint folder."""
    with atomic_dir(path) as tmp:
        model.save(tmp)
        tensors, meta = _flatten_optimizer(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        write_json(tmp / "trainer_state.json", {**trainer_state, "optimizer": meta})


def load_training_state(path, model: MatchingModel, optimizer) -> dict:
    d = complete_dir(path)
    if d is None:
        raise DataError(path, "no checkpoint to resume from")
    model.load_weights(d / "model.safetensors")
    tensors = load_file(str(d / "optimizer.safetensors"))
    rng = tensors.pop("rng.torch")
    state_file = d / "trainer_state.json"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as e:
        raise DataError(state_file, f"unreadable trainer state: {e}") from None
    optimizer.load_state_dict(_unflatten_optimizer(tensors, state.pop("optimizer")))
    torch.set_rng_state(rng)
    return state


def latest_checkpoint(run_dir) -> Path | None:
    return complete_dir(Path(run_dir) / "last")
