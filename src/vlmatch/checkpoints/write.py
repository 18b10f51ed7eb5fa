"""Writing a checkpoint folder: each file atomically (:mod:`vlmatch.io`), ``checksums.json`` last; a training
checkpoint (model, optimiser, trainer state) built under a temporary name and swapped in whole, so a kill leaves
the old one or the new one. No pickle.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

from ..errors import DataError
from ..io import atomic_dir, write_bytes, write_json
from .seal import CHECKPOINT_FORMAT, seal_checkpoint


def save_model(model, directory) -> Path:
    """``model.save(directory)``: weights, config.json (with their SHA-256), vocabulary, the model's own files and
    calibration, then checksums.json. A caller that adds files afterwards seals it again."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    data = safetensors_bytes(state)
    write_bytes(directory / "model.safetensors", data)
    digest = hashlib.sha256(data).hexdigest()
    write_json(directory / "config.json", {**model.config_dict(), "weights_sha256": digest,
                                           "format": CHECKPOINT_FORMAT})
    if model.vocab is not None:
        model.vocab.save(directory / "vocab.json")
    model.save_extra(directory)
    if model.calibration is not None:
        loaded = model.__dict__.get("_loaded_calibration") is model.calibration  # checked at load for these weights
        if model.calibration.weights_sha256 not in (None, digest) and not loaded:
            raise DataError(directory / "calibration.json", "the model's calibration was fitted for other "
                            f"weights ({model.calibration.weights_sha256[:12]}...): fit it again for these")
        model.calibration.save(directory, weights_sha256=digest)

    seal_checkpoint(directory)
    return directory


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


def save_training_state(path, model, optimizer, trainer_state: dict) -> None:
    """Atomically write (replace) a resumable checkpoint folder."""
    with atomic_dir(path) as tmp:
        model.save(tmp)
        tensors, meta = _flatten_optimizer(optimizer)
        tensors["rng.torch"] = torch.get_rng_state()
        data = safetensors_bytes(tensors)
        write_bytes(tmp / "optimizer.safetensors", data)
        write_json(tmp / "trainer_state.json", {**trainer_state, "optimizer": meta,
                                                 "optimizer_sha256": hashlib.sha256(data).hexdigest()})
        seal_checkpoint(tmp)  # the trainer state and optimiser with the model
