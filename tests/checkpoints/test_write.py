"""Writing a checkpoint folder: a model's files, then the seal over all of them; a training checkpoint
(the model, its optimiser and the trainer state) swapped in whole and sealed together."""

from __future__ import annotations

import hashlib
import json

import torch

from vlmatch import create_model, load_model
from vlmatch.checkpoints.read import load_training_state
from vlmatch.checkpoints.seal import CHECKPOINT_FORMAT, CHECKSUMS, verify_checkpoint
from vlmatch.checkpoints.write import save_training_state
from vlmatch.weights import sha256_file

from .test_seal import _save


def test_save_lists_every_file_and_a_whole_folder_loads(tmp_path):
    _save(tmp_path / "ck")
    listed = json.loads((tmp_path / "ck" / CHECKSUMS).read_text())["files"]
    assert set(listed) == {"model.safetensors", "config.json", "vocab.json", "calibration.json",
                           "calibration.safetensors"}
    assert listed["calibration.json"] == sha256_file(tmp_path / "ck" / "calibration.json")
    assert load_model(tmp_path / "ck").calibration.beta == 15.0


def test_a_training_checkpoint_is_swapped_in_whole_and_sealed_with_its_optimiser(tmp_path):
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 3, 4), None, torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 2])).sum().backward()
    opt.step()
    last = tmp_path / "last"
    save_training_state(last, m, opt, {"epoch": 0, "step_in_epoch": 1, "global_step": 1})
    files = verify_checkpoint(last)
    assert set(files) == {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"}
    config = json.loads((last / "config.json").read_text())
    assert config["format"] == CHECKPOINT_FORMAT and config["weights_sha256"] == files["model.safetensors"]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["optimizer_sha256"] == hashlib.sha256((last / "optimizer.safetensors").read_bytes()).hexdigest()
    save_training_state(last, m, opt, {"epoch": 0, "step_in_epoch": 2, "global_step": 2})  # replaces it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # no .prev, no temporaries left
    assert load_training_state(last, m, opt)["global_step"] == 2
