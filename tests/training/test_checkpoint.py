"""Checkpoints from elsewhere: content hash, shapes checked against the header before building, vocab size."""

import json
import shutil

import pytest
import torch

from vlmatch import create_model, load_model
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError
from vlmatch.training.checkpoint import load_training_state, save_training_state


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    m = create_model("scan_t2i_avg", img_dim=6, embed_dim=8, word_dim=4, vocab_size=12)
    m.vocab = Vocab([f"w{i}" for i in range(8)])
    m.save(tmp_path / "ck")
    return tmp_path / "ck"


def _edit_config(ck, **opts):
    cfg = json.loads((ck / "config.json").read_text())
    cfg["config"].update(opts)
    (ck / "config.json").write_text(json.dumps(cfg))


def test_flipped_bytes_in_the_weights_are_detected(ckpt):
    assert len(json.loads((ckpt / "config.json").read_text())["weights_sha256"]) == 64
    raw = bytearray((ckpt / "model.safetensors").read_bytes())
    raw[-5] ^= 0x01  # two flipped bits in the tensor data: the file still parses and loads
    raw[-40] ^= 0x10
    (ckpt / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"model.safetensors: content does not match the SHA-256 recorded in "
                                        r"config.json .*corrupt or was replaced"):
        load_model(ckpt)


def test_dims_that_do_not_fit_the_weights_are_named_before_building(ckpt):
    _edit_config(ckpt, embed_dim=16)
    with pytest.raises(DataError, match=r"model.safetensors: weights do not fit .*config.json \(model scan_t2i_avg\): "
                                        r"img_enc.fc.weight: \(8, 6\) in the file, \(16, 6\) needed"):
        load_model(ckpt)


def test_absurd_sizes_in_config_json_allocate_nothing(ckpt):
    # a real build would need ~10^13 floats for the GRU alone; the header check refuses it first
    _edit_config(ckpt, embed_dim=4_000_000, word_dim=3_000_000)
    with pytest.raises(DataError, match="weights do not fit"):
        load_model(ckpt)
    _edit_config(ckpt, embed_dim="8")
    with pytest.raises(DataError, match=r"config.json: model.embed_dim must be an integer .* got the string '8'"):
        load_model(ckpt)


def test_a_vocabulary_larger_than_the_embedding_is_refused(ckpt):
    Vocab([f"w{i}" for i in range(20)]).save(ckpt / "vocab.json")  # 24 words, 12 embedding rows
    with pytest.raises(DataError, match=r"vocab.json: 24 words, but the model's vocab_size in config.json is 12"):
        load_model(ckpt)


def test_an_interrupted_swap_falls_back_to_the_previous_checkpoint(ckpt, capsys):
    shutil.move(ckpt, ckpt.with_name("last.prev"))
    m = load_model(ckpt.with_name("last"))
    assert m.name == "scan_t2i_avg"
    assert "loading" in capsys.readouterr().err


def test_a_corrupt_optimizer_file_is_refused_on_resume(tmp_path):
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 3, 4), None, torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 2])).sum().backward()
    opt.step()
    save_training_state(tmp_path / "last", m, opt, {"epoch": 0, "step_in_epoch": 1, "global_step": 1})
    assert load_training_state(tmp_path / "last", m, opt)["global_step"] == 1
    raw = bytearray((tmp_path / "last" / "optimizer.safetensors").read_bytes())
    raw[-3] ^= 0xFF
    (tmp_path / "last" / "optimizer.safetensors").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="optimizer.safetensors: content does not match"):
        load_training_state(tmp_path / "last", m, opt)
