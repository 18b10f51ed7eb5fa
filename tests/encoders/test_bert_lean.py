"""The lean inference forward of BERT used for search queries: the Hugging Face model's token vectors
(up to float rounding), with padding, and ``None`` for whatever it does not reproduce."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch.encoders.bert_lean import TOLERANCE, lean_forward, supported
from vlmatch.encoders.hf import HFTextEncoder, load_transformer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert_folder(tmp_path_factory.mktemp("tinybert"), hidden=32, layers=3, heads=4,
                            words=("a", "dog", "red", "ball", "runs"))


def _with_config(tiny, tmp_path, **changes):
    folder = tmp_path / "changed"
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_lean_forward_equals_the_model_with_padding(tiny):
    enc = HFTextEncoder(tiny)
    tokens, lengths = enc.tokenize(["a red dog", "a dog runs after a red ball", "ball"])
    lean = lean_forward(enc.model, tokens[:1, : int(lengths[0])])
    assert lean is not None
    mask = torch.arange(tokens.shape[1])[None] < lengths[:, None]
    with torch.no_grad():
        want = enc(tokens, lengths)
        got = lean(tokens, mask) * mask[..., None]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # lengths the probe did not have (a frozen graph is not tied to one shape)
        one = enc.tokenize(["a dog runs after a red ball a red ball"])
        torch.testing.assert_close(lean(one[0], torch.ones_like(one[0], dtype=torch.bool)), enc(*one),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", [{"hidden_act": "relu"}, {"position_embedding_type": "relative_key"}])
def test_what_it_does_not_reproduce_keeps_the_model_forward(tiny, tmp_path, change):
    model = load_transformer(_with_config(tiny, tmp_path, **change))
    assert not supported(model.config.to_dict())
    assert lean_forward(model, torch.tensor([[2, 5, 6, 3]])) is None


def test_a_lean_graph_that_differs_from_the_model_is_refused(tiny, monkeypatch):
    """The probe check is what guards the swap: a forward that computes something else is not used."""
    import vlmatch.encoders.bert_lean as bl

    model = load_transformer(tiny)
    assert lean_forward(model, torch.tensor([[2, 5, 6, 3]])) is not None
    monkeypatch.setattr(bl, "TOLERANCE", -1.0)  # nothing passes
    assert lean_forward(model, torch.tensor([[2, 5, 6, 3]])) is None
    assert TOLERANCE > 0


def test_double_precision_models_keep_their_own_forward(tiny):
    model = load_transformer(tiny).double()
    assert lean_forward(model, torch.tensor([[2, 5, 6, 3]])) is None
