"""Every registered model: creation with the common size names, protocol shapes, save/load."""

import pytest
import torch

from vlmatch import create_model, list_models, load_model
from vlmatch.errors import ConfigError, DataError


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
