"""Every registered model: creation with the common size names, protocol shapes, save/load."""

import json

import pytest
import torch

from vlmatch import create_model, list_models, load_model
from vlmatch.errors import ConfigError, DataError
from vlmatch.models import registry


@pytest.mark.parametrize("name", list_models())
def test_every_model_follows_the_protocol_and_roundtrips(name, tmp_path):
    torch.manual_seed(0)
    m = create_model(name, img_dim=16, embed_dim=16, word_dim=6, vocab_size=20).eval()
    feats = torch.randn(3, 5, 16)
    tokens = torch.randint(1, 20, (4, 7))
    lengths = torch.tensor([7, 3, 5, 1])
    with torch.no_grad():
        img, txt = m.encode_images(feats), m.encode_texts(tokens, lengths)
        s = m.score(img, txt)
    assert s.shape == (3, 4) and torch.isfinite(s).all()
    m.save(tmp_path / "ck")
    m2 = load_model(tmp_path / "ck")
    assert m2.name == name and m2.cfg == m.cfg
    with torch.no_grad():
        torch.testing.assert_close(m2.score(m2.encode_images(feats), m2.encode_texts(tokens, lengths)), s)


def test_unknown_model_and_option():
    with pytest.raises(ConfigError, match="unknown model"):
        create_model("nope")
    with pytest.raises(ConfigError, match="no option"):
        create_model("vsepp", lambda_softmax=3)


def test_load_model_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="config.json not found"):
        load_model(tmp_path)
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
    m.save(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(DataError, match="model.safetensors: not a readable safetensors"):
        load_model(tmp_path)


LEGACY = sorted({n for n in list_models() if registry.model_class(n).legacy_options})


def test_changed_defaults_have_loader_rules():
    """MTFN now defaults to the paper's raw inputs and SMAN to the paper's concatenated inference score; a
    checkpoint that recorded neither loads with the old value (see test below)."""
    assert {"mtfn", "mtfn_sentence", "sman"} <= set(LEGACY)
    assert create_model("mtfn", vocab_size=10).cfg.input_norm == "none"
    assert registry.model_class("mtfn").legacy_options["input_norm"] == "l2"
    assert create_model("sman", vocab_size=10).cfg.score_mode == "concat"
    assert registry.model_class("sman").legacy_options["score_mode"] == "sum"


@pytest.mark.parametrize("name", LEGACY)
def test_a_checkpoint_without_the_newer_keys_scores_exactly_as_before(name, tmp_path):
    """A config.json that lacks an option (saved before it existed, or before its default changed) loads
    with the value it was made with (``legacy_options``), not today's default: the same scores."""
    legacy = registry.model_class(name).legacy_options
    torch.manual_seed(0)
    m = create_model(name, img_dim=16, embed_dim=16, word_dim=6, vocab_size=20, **legacy).eval()
    feats, tokens, lengths = torch.randn(3, 16, 16), torch.randint(1, 20, (4, 7)), torch.tensor([7, 3, 5, 1])
    with torch.no_grad():
        s = m.score(m.encode_images(feats), m.encode_texts(tokens, lengths))
    m.save(tmp_path / "ck")
    path = tmp_path / "ck" / "config.json"
    saved = json.loads(path.read_text())
    for key in legacy:
        del saved["config"][key]
    saved.pop("format", None)  # as saved then: before config.json recorded its format
    path.write_text(json.dumps(saved))
    (tmp_path / "ck" / "checksums.json").unlink()  # as saved then: before checkpoints were sealed
    old = load_model(tmp_path / "ck")
    assert old.cfg == m.cfg
    with torch.no_grad():
        torch.testing.assert_close(old.score(old.encode_images(feats), old.encode_texts(tokens, lengths)), s,
                                   rtol=0, atol=0)
