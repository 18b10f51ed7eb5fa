"""The model protocol's extension points: own objective, own tokenizer, stage-1 vectors, attention."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.vocab import Vocab
from vlmatch.errors import VlmatchError
from vlmatch.models.base import ImageEncoding, MatchingModel, ModelConfig, TextEncoding, l2norm
from vlmatch.models.registry import _REGISTRY, load_model, register
from vlmatch.training.config import load_config
from vlmatch.training.loop import train


@dataclass
class CharConfig(ModelConfig):
    pass


class CharModel(MatchingModel):
    """A tiny model that brings its own character tokenizer (no word vocabulary) and its own loss."""

    Config = CharConfig
    uses_vocab = False
    loss_calls: list = []

    def __init__(self, cfg):
        super().__init__(cfg)
        self.alphabet = "abcdefghijklmnopqrstuvwxyz "
        self.img = torch.nn.Linear(cfg.img_dim, cfg.embed_dim)
        self.emb = torch.nn.EmbeddingBag(len(self.alphabet) + 2, cfg.embed_dim, mode="mean", padding_idx=0)

    def tokenize(self, captions):
        ids = [[self.alphabet.index(ch) + 2 if ch in self.alphabet else 1 for ch in c.lower()] or [1] for c in captions]
        from vlmatch.data.loaders import pad_tokens

        return pad_tokens(ids)

    def encode_images(self, features, mask=None):
        return ImageEncoding(embedding=l2norm(self.img(features.mean(1))))

    def encode_texts(self, tokens, lengths):
        return TextEncoding(lengths=lengths, embedding=l2norm(self.emb(tokens)))

    def score(self, img, txt):
        return img.embedding @ txt.embedding.T

    def loss(self, scores, batch, train_cfg, hardest):
        CharModel.loss_calls.append((tuple(scores.shape), hardest))
        return super().loss(scores, batch, train_cfg, hardest) + 0.0 * scores.sum()

    def save_extra(self, directory):
        (directory / "alphabet.json").write_text(json.dumps(self.alphabet))

    def load_extra(self, directory):
        self.alphabet = json.loads((directory / "alphabet.json").read_text())


if "_test_char" not in _REGISTRY:
    register("_test_char", CharModel, "test-only model with its own tokenizer")


def test_default_tokenize_is_the_vocabulary():
    vocab = Vocab.build(["a red dog", "a blue car"], 1)
    m = create_model("scan_t2i_avg", img_dim=4, embed_dim=4, word_dim=4, vocab_size=len(vocab))
    with pytest.raises(VlmatchError, match="no vocabulary"):
        m.tokenize(["a dog"])
    m.vocab = vocab
    tokens, lengths = m.tokenize(["a red dog", "a blue unknownword car"])
    assert lengths.tolist() == [5, 6]
    assert tokens[0, :5].tolist() == vocab.encode("a red dog") and tokens[0, 5] == 0
    assert m.decode_tokens(tokens[1], 6)[1:5] == ["a", "blue", "<unk>", "car"]


def test_trainer_uses_the_models_tokenizer_objective_and_extras(small_world, tmp_path):
    CharModel.loss_calls.clear()
    cfg = load_config(None, ["model.name=_test_char", "model.embed_dim=8", f"data.path={small_world}",
                             "train.epochs=2", "train.warmup_epochs=1", "train.batch_size=64",
                             "train.max_steps_per_epoch=3"])
    best = train(cfg, tmp_path / "run", progress=False)
    assert best["rsum"] > 0
    assert [h for _, h in CharModel.loss_calls] == [False] * 3 + [True] * 3  # warm-up, then hardest
    assert all(shape == (64, 64) for shape, _ in CharModel.loss_calls)
    assert not (tmp_path / "run" / "best" / "vocab.json").exists()  # no word vocabulary was built
    m = load_model(tmp_path / "run" / "best")
    assert isinstance(m, CharModel) and (tmp_path / "run" / "best" / "alphabet.json").is_file()
    tokens, lengths = m.tokenize(["ab c"])
    assert tokens[0].tolist() == [2, 3, 28, 4] and lengths.tolist() == [4]


def test_global_embeddings_give_the_vsepp_score():
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=6, embed_dim=8, word_dim=4, vocab_size=10).eval()
    img = m.encode_images(torch.randn(3, 5, 6))
    txt = m.encode_texts(torch.randint(1, 10, (4, 7)), torch.tensor([7, 5, 3, 1]))
    a, b = m.global_embeddings(img, txt)
    torch.testing.assert_close(a @ b.T, m.score(img, txt))
    scan = create_model("scan_t2i_avg", img_dim=6, embed_dim=8, word_dim=4, vocab_size=10)
    assert scan.global_embeddings(scan.encode_images(torch.randn(1, 5, 6)),
                                  scan.encode_texts(torch.tensor([[1, 2]]), torch.tensor([2]))) is None


def test_pair_attention_is_a_protocol_method():
    torch.manual_seed(0)
    m = create_model("scan_i2t_avg", img_dim=6, embed_dim=8, word_dim=4, vocab_size=10).eval()
    img = m.encode_images(torch.randn(1, 5, 6))
    txt = m.encode_texts(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    att = m.pair_attention(img, txt)
    assert att["axis"] == "words" and att["weights"].shape == (5, 3)
    np.testing.assert_allclose(att["weights"].sum(axis=1), 1.0, rtol=1e-5)
    with pytest.raises(VlmatchError, match="no word-region attention"):
        create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=8).pair_attention(img, txt)
