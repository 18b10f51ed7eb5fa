"""The offline Hugging Face text encoder: local folders only, tokenizer + token vectors, frozen or not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch.encoders.hf import (
    HFTextEncoder,
    default_encoder_path,
    encoder_hash,
    for_queries,
    load_tokenizer,
    resolve_encoder_path,
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


def test_query_encoding_skips_the_disk_cache_and_runs_a_folder_once_per_text(tiny, tmp_path, monkeypatch):
    """Index.open's query mode: nothing is written to the on-disk output cache, and two encoders of one
    folder (a retriever and a re-scorer) share one forward per text through the in-memory memo (the
    lean inference forward, equal to the model's up to float rounding)."""
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    a, b = HFTextEncoder(tiny), HFTextEncoder(tiny)
    calls = []
    for enc in (a, b):
        monkeypatch.setattr(enc, "forward", lambda *x, f=enc.forward, **k: calls.append(k["lean"]) or f(*x, **k))
    for_queries(a, b)
    tokens, lengths = a.tokenize(["a red dog runs"])
    want = HFTextEncoder.forward(a, tokens, lengths)
    got_a = a.token_vectors(tokens, lengths)
    got_b = b.token_vectors(tokens, lengths)
    assert calls == [True]  # the lean forward, once
    torch.testing.assert_close(got_a, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_b, got_a, rtol=0, atol=0)
    kept = got_a.clone()
    got_a.zero_()  # a caller's in-place change does not reach the memo
    torch.testing.assert_close(b.token_vectors(tokens, lengths), kept, rtol=0, atol=0)
    other = a.tokenize(["a ball"])
    a.token_vectors(*other)
    assert len(calls) == 2
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.npy"))


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


def _copy(tiny, tmp_path, name="bad"):
    import shutil

    return Path(shutil.copytree(tiny, tmp_path / name))


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def _pickle_only(folder):
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)


BROKEN = {  # name: (change to the folder, words of the one-line error)
    "garbage config": (lambda f: (f / "config.json").write_text("garbage{"), "config.json: not valid JSON"),
    "list config": (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json: must hold a JSON object"),
    "negative hidden size": (lambda f: _edit_config(f, hidden_size=-32), "hidden_size is -32; it must be an integer"),
    "no layers": (lambda f: _edit_config(f, num_hidden_layers=-1), "num_hidden_layers is -1"),
    "zero heads": (lambda f: _edit_config(f, num_attention_heads=0), "num_attention_heads is 0"),
    "absurd hidden size": (lambda f: _edit_config(f, hidden_size=10**9, num_attention_heads=1), "hidden_size is 1000000000"),
    "absurd vocabulary": (lambda f: _edit_config(f, vocab_size=10**10), "vocab_size is 10000000000"),
    "text size": (lambda f: _edit_config(f, hidden_size="big"), "hidden_size is 'big'"),
    "sizes of another model": (lambda f: _edit_config(f, hidden_size=1024, intermediate_size=4096, num_attention_heads=16),
                               "the config does not belong to these weights"),
    "weights of another shape": (lambda f: _edit_config(f, hidden_size=40, intermediate_size=64),
                                 "the weights do not fit config.json"),
    "truncated safetensors": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:5000]),
                              "model.safetensors: a truncated or damaged safetensors file"),
    "garbage safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"garbage" * 10),
                            "model.safetensors: a truncated or damaged safetensors file"),
    "pickle only": (_pickle_only, "only safetensors weights are read; pytorch_model.bin is a pickle, which is never loaded"),
    "no tokenizer files": (_no_tokenizer, "no tokenizer files"),
    "empty vocabulary": (lambda f: ((f / "tokenizer.json").unlink(), (f / "vocab.txt").write_text("")),
                         "the tokenizer files cannot be read"),
    "vocabulary of specials only": (lambda f: ((f / "tokenizer.json").unlink(),
                                               (f / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")),
                                    "the tokenizer knows no words"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_encoder_folders_are_refused_in_one_line(tiny, tmp_path, case):
    folder = _copy(tiny, tmp_path)
    change, words = BROKEN[case]
    change(folder)
    with pytest.raises(DataError) as e:
        HFTextEncoder(folder)
    assert words in str(e.value) and str(folder) in str(e.value)
    assert "\n" not in str(e.value) and "weights_only" not in str(e.value)


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(tiny, tmp_path):
    folder = _copy(tiny, tmp_path)
    (folder / "tokenizer.json").unlink()  # the tokenizer is read from vocab.txt, with words the model lacks
    with open(folder / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("".join(f"extra{i}\n" for i in range(20)))
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    with pytest.raises(DataError, match=f"the tokenizer has {rows + 20} tokens but the model's embedding table has "
                                        f"{rows} rows"):
        HFTextEncoder(folder)


def test_a_folder_without_tokenizer_files_stops_mmca_and_rerank(tiny, tmp_path, capsys):
    from vlmatch import create_model
    from vlmatch.cli import main

    folder = _copy(tiny, tmp_path)
    _no_tokenizer(folder)
    with pytest.raises(DataError, match="no tokenizer files"):
        create_model("mmca", img_dim=8, text_encoder=str(folder))
    from ..conftest import write_precomp

    np.save(tmp_path / "s.npy", np.random.default_rng(0).random((4, 20)))
    write_precomp(tmp_path / "data", "test", np.zeros((4, 2, 8)), [f"a dog {i}" for i in range(20)])
    assert main(["rerank", "--sims", str(tmp_path / "s.npy"), "--text-model", str(folder), "--data",
                 str(tmp_path / "data"), "--split", "test", "--no-progress"]) == 2
    assert "no tokenizer files" in capsys.readouterr().err
