"""The one checkpoint loader (vlmatch.checkpoints.read, issue #50): a model is built once (on the meta
device, then filled), each file is read once, the tokenizer once per content in a process, and what it
loads scores exactly as what was saved, also with a frozen transformer and LoRA adapters.

Checkpoints from elsewhere: content hash, shapes checked against the header before building, vocab size;
a training checkpoint's optimiser checked on resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vlmatch import create_model, load_model
from vlmatch.checkpoints import read
from vlmatch.checkpoints.read import load_training_state
from vlmatch.checkpoints.write import save_training_state
from vlmatch.data.vocab import Vocab
from vlmatch.encoders import hf
from vlmatch.errors import DataError
from vlmatch.models import registry
from vlmatch.weights import read_header

from ..models.test_mmca import CAPTIONS, tiny_bert  # noqa: F401 (a session fixture)


def _scores(model, seed=3):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, 5, model.cfg.img_dim, generator=g)
    tokens, lengths = model.tokenize(CAPTIONS)
    with torch.no_grad():
        return model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)
    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("opts", [{}, {"text_lora": {"rank": 2, "targets": ["query", "value"], "alpha": 4}}],
                         ids=["frozen", "lora"])
def test_a_checkpoint_is_built_once_and_its_tokenizer_and_header_read_once(opts, tiny_bert, tmp_path,  # noqa: F811
                                                                            monkeypatch):
    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=12, embed_dim=8, text_encoder=tiny_bert, text_cache=False, **opts).eval()
    if opts:  # adapters that change the output (B starts at zero)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
    want = _scores(model)
    model.save(tmp_path / "m")
    hf._TOKENIZERS.clear()
    builds = _counting(monkeypatch, registry, "create_model")
    tokenizers = _counting(monkeypatch, hf, "_read_tokenizer")
    import vlmatch.weights as weights

    headers = _counting(monkeypatch, weights, "read_header")
    again = load_model(tmp_path / "m")
    assert len(builds) == 1  # no second build to check shapes
    assert len(tokenizers) == 1  # the encoder folder's tokenizer and the checkpoint's copy: one content, one read
    assert len(headers) == 1
    assert not any(p.is_meta for p in again.state_dict().values())
    assert not any(p.is_meta for p in again.pretrained_text.hf.model.parameters())  # the frozen transformer was loaded for real
    torch.testing.assert_close(_scores(again), want)


def test_a_model_on_the_meta_device_is_filled_with_every_tensor_of_the_file(tmp_path):
    torch.manual_seed(0)
    m = create_model("mtfn", img_dim=6, embed_dim=8, word_dim=4, vocab_size=12, rank=3, fusion_dim=5)
    m.save(tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert set(read_header(tmp_path / "m" / "model.safetensors")) == set(again.state_dict())
    for k, v in m.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    assert again.tt_trained.dtype == torch.uint8 and not again.tt_trained.is_meta


def test_the_resolver_needs_no_torch_and_names_a_run_folder(tmp_path):
    (tmp_path / "run" / "best").mkdir(parents=True)
    (tmp_path / "run" / "best" / "config.json").write_text("{}")
    with pytest.raises(Exception, match=r"a run folder, not a checkpoint: use .*best \(best on validation\)"):
        read.checkpoint_folder(tmp_path / "run")
    assert read.resolve_checkpoint(tmp_path) == tmp_path


@pytest.mark.parametrize(("text", "problem"), [('[1]', "expected an object with 'name' and 'config'"),
                                               ('{"name": "vsepp"}', "expected an object with 'name' and 'config'"),
                                               ('{"name": "vsepp", "config": 3}', "'config' must be an object")])
def test_a_malformed_config_json_is_named_wherever_it_is_read(tmp_path, text, problem):
    (tmp_path / "config.json").write_text(text)
    for reading in (read.read_checkpoint, lambda d: read.read_config_json(d / "config.json")):
        with pytest.raises(DataError, match=f"config.json: {problem}"):
            reading(tmp_path)


def test_weights_stored_in_float16_load_in_the_dtype_the_model_declares(tmp_path):
    import hashlib
    import json

    from safetensors.torch import load_file, save

    from vlmatch.checkpoints.seal import seal_checkpoint

    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=6, embed_dim=8, word_dim=4, vocab_size=12)
    m.save(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    data = save({k: v.half() for k, v in load_file(str(f)).items()})  # as a shipped checkpoint may store them
    f.write_bytes(data)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["weights_sha256"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    seal_checkpoint(tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert {p.dtype for p in again.parameters()} == {torch.float32}
    for k, v in m.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v.half().float())


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


def test_a_training_checkpoint_saved_sealed_is_refused_without_its_seal(tmp_path):
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
    opt = torch.optim.Adam(m.parameters())
    save_training_state(tmp_path / "last", m, opt, {"epoch": 0, "step_in_epoch": 1, "global_step": 1})
    (tmp_path / "last" / "checksums.json").unlink()
    with pytest.raises(DataError, match=r"last: has no checksums.json, but its config.json says format 2") as e:
        load_training_state(tmp_path / "last", m, opt)
    assert "\n" not in str(e.value)
    cfg = json.loads((tmp_path / "last" / "config.json").read_text())
    cfg.pop("format")  # as saved before vlmatch sealed checkpoints: resumed, its weights checked against config.json
    (tmp_path / "last" / "config.json").write_text(json.dumps(cfg))
    assert load_training_state(tmp_path / "last", m, opt)["global_step"] == 1
