"""The offline Hugging Face text encoder: local folders only, tokenizer + token vectors, frozen or not."""

from __future__ import annotations

import pytest
import torch

from vlmatch.encoders.hf import (
    HFTextEncoder,
    default_encoder_path,
    encoder_hash,
    load_tokenizer,
    resolve_encoder_path,
    tiny_bert_folder,
)
from vlmatch.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert_folder(tmp_path_factory.mktemp("tinybert"), words=("a", "dog", "red", "ball", "runs"))


def test_tokenize_and_encode_with_masks(tiny):
    enc = HFTextEncoder(tiny)
    tokens, lengths = enc.tokenize(["a red dog", "a dog runs after a red ball"])
    assert tokens.dtype == torch.long and lengths.tolist() == [5, 13]  # "after" -> a ##f ##t ##e ##r
    assert enc.decode(tokens[0], 5) == ["[CLS]", "a", "red", "dog", "[SEP]"]
    assert tokens[0, 5:].eq(0).all()
    out = enc(tokens, lengths)
    assert out.shape == (2, 13, enc.hidden_size) == (2, 13, 32)
    assert out[0, 5:].eq(0).all() and out[0, :5].abs().sum() > 0
    # padding does not leak into valid positions: the short caption alone gives the same vectors
    alone = enc(tokens[:1, :5], lengths[:1])
    torch.testing.assert_close(alone[0], out[0, :5], rtol=1e-5, atol=1e-5)


def test_frozen_encoder_is_outside_the_parameter_tree(tiny):
    frozen = HFTextEncoder(tiny)
    assert list(frozen.parameters()) == [] and frozen.state_dict() == {}
    frozen.train()
    assert not frozen.model.training  # dropout stays off
    frozen.double()
    assert next(frozen.model.parameters()).dtype == torch.float64
    tokens, lengths = frozen.tokenize(["a dog"])
    assert frozen(tokens, lengths).dtype == torch.float64 and not frozen(tokens, lengths).requires_grad
    tuned = HFTextEncoder(tiny, trainable=True)
    assert len(list(tuned.parameters())) > 0
    tuned(*tuned.tokenize(["a dog"])).sum().backward()
    assert tuned.model.embeddings.word_embeddings.weight.grad is not None


def test_tokenizer_copy_reloads_offline(tiny, tmp_path):
    enc = HFTextEncoder(tiny)
    enc.save_tokenizer(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert again("a red ball")["input_ids"] == enc.tokenizer("a red ball")["input_ids"]


def test_hash_names_the_folder_contents(tiny, tmp_path):
    h = encoder_hash(tiny)
    assert len(h) == 64 and encoder_hash(tiny) == h
    other = tiny_bert_folder(tmp_path / "other", words=("a", "dog"), seed=1)
    assert encoder_hash(other) != h


def test_default_folder_is_the_packaged_minilm():
    p = default_encoder_path()
    assert (p / "config.json").is_file() and (p / "tokenizer.json").is_file()
    assert resolve_encoder_path(None) == p == resolve_encoder_path("all-minilm-l6-v2")


def test_bad_folders_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve_encoder_path(tmp_path / "missing")
    with pytest.raises(DataError, match="config.json: not found"):
        resolve_encoder_path(tmp_path)
