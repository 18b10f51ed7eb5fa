"""A frozen BERT without transformers (encoders/bert_plain.py): the same token vectors as transformers'
BertModel and the same token ids as its tokenizer, on a tiny random BERT and on the packaged MiniLM;
anything it does not reproduce goes through transformers."""

from __future__ import annotations

import json

import pytest
import torch

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch.data.loaders import pad_tokens
from vlmatch.encoders.bert_plain import FastTokenizer, PlainBert, fast_tokenizer, plain_bert
from vlmatch.encoders.hf import HFTextEncoder, _read_tokenizer, read_config, resolve_encoder_path

CAPTIONS = ["a dog runs on the grass", "Two  PEOPLE, walking!", "", "Ünïcödé café — naïve 東京 🐶", "ﬁ x " * 40,
            "[CLS] a [MASK] b", "\tA\nB"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert_folder(tmp_path_factory.mktemp("bert"), hidden=32, layers=2, heads=4,
                            words=("dog", "runs", "grass", "people", "walking"))


def _hf(path):
    import transformers

    return (transformers.AutoModel.from_pretrained(str(path), local_files_only=True).eval(),
            transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True))


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_the_same_ids_and_token_vectors_as_transformers(which, tiny):
    path = tiny if which == "tiny" else resolve_encoder_path(None)
    model, tok = _hf(path)
    plain, fast = plain_bert(path, read_config(path)), fast_tokenizer(path)
    assert isinstance(plain, PlainBert) and isinstance(fast, FastTokenizer)
    for n in (64, 6, 3):
        assert fast(CAPTIONS, truncation=True, max_length=n)["input_ids"] == \
            tok(CAPTIONS, truncation=True, max_length=n, padding=False)["input_ids"]
    assert (len(fast), fast.unk_token, fast.unk_token_id) == (len(tok), tok.unk_token, tok.unk_token_id)
    tokens, lengths = pad_tokens(fast(CAPTIONS, truncation=True, max_length=64)["input_ids"])
    assert fast.convert_ids_to_tokens(tokens[1].tolist()) == tok.convert_ids_to_tokens(tokens[1].tolist())
    mask = torch.arange(tokens.shape[1])[None] < lengths[:, None]
    with torch.no_grad():
        want = model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        got = plain(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(got * mask[..., None], want * mask[..., None], atol=2e-5, rtol=1e-5)
    assert not any(p.requires_grad or p.is_meta for p in plain.parameters())


def test_a_frozen_encoder_uses_them_and_a_trainable_one_transformers(tiny):
    frozen, trained = HFTextEncoder(tiny), HFTextEncoder(tiny, trainable=True)
    assert isinstance(frozen.model, PlainBert) and isinstance(frozen.tokenizer, FastTokenizer)
    assert not isinstance(trained.model, PlainBert)
    tokens, lengths = frozen.tokenize(CAPTIONS[:2])
    with torch.no_grad():
        torch.testing.assert_close(frozen(tokens, lengths), trained.eval()(tokens, lengths), atol=2e-5, rtol=1e-5)


def test_what_it_does_not_reproduce_goes_through_transformers(tiny, tmp_path):
    cfg = read_config(tiny)
    for change in ({"hidden_act": "relu"}, {"position_embedding_type": "relative_key"}, {"model_type": "roberta"},
                   {"is_decoder": True}):
        assert plain_bert(tiny, {**cfg, **change}) is None, change
    assert plain_bert(tmp_path, cfg) is None  # no model.safetensors
    other = tmp_path / "tok"
    other.mkdir()
    for f in ("tokenizer.json", "vocab.txt"):
        (other / f).write_bytes((tiny / f).read_bytes())
    conf = json.loads((tiny / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**conf, "do_lower_case": False}))  # differs from the normaliser
    assert fast_tokenizer(other) is None
    assert not isinstance(_read_tokenizer(other), FastTokenizer)


def test_an_encoder_folders_digest_is_kept_on_disk_and_a_changed_file_changes_it(tmp_path, monkeypatch):
    from vlmatch.encoders import hf

    folder = tmp_path / "enc"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "vocab.txt").write_text("a\nb\n")
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    hf._hash_cached.cache_clear()
    want = hf.encoder_hash(folder)
    (kept_file,) = (tmp_path / "cache" / "digests").iterdir()
    hf._hash_cached.cache_clear()
    reads = []
    monkeypatch.setattr(hf, "hash_file_into", lambda h, f: reads.append(f))
    assert hf.encoder_hash(folder) == want and reads == []  # a second process: read from the cache, no file hashed
    monkeypatch.undo()
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    (folder / "vocab.txt").write_text("a\nbc\n")  # the file's stat stamp moves, so the key does
    hf._hash_cached.cache_clear()
    assert hf.encoder_hash(folder) != want
    assert kept_file.read_text().strip() == want
