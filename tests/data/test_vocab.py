import json

import pytest

from vlmatch.data.tokenizer import tokenize
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError


@pytest.mark.parametrize("text,tokens", [
    ("A man's T-shirt, isn't it?", ["a", "man", "'s", "t-shirt", ",", "is", "n't", "it", "?"]),
    ("Two dogs play in the snow.", ["two", "dogs", "play", "in", "the", "snow", "."]),
    ("It costs 3.5 dollars!", ["it", "costs", "3.5", "dollars", "!"]),
    ("They're \"happy\"", ["they", "'re", '"', "happy", '"']),
])
def test_tokenizer_matches_nltk_on_ordinary_captions(text, tokens):
    assert tokenize(text) == tokens


def test_build_counts_min_and_special_ids():
    v = Vocab.build(["a dog", "a dog", "a cat", "a dog", "a bird"] * 1, min_count=2)
    assert v.idx2word[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert "a" in v and "dog" in v and "cat" not in v
    assert v.encode("a cat") == [1, v.word2idx["a"], 3, 2]


def test_scan_json_roundtrip(tmp_path):
    v = Vocab.build(["red car", "red bus", "blue car"], min_count=1)
    v.save(tmp_path / "vocab.json")
    obj = json.loads((tmp_path / "vocab.json").read_text())
    assert set(obj) == {"word2idx", "idx2word", "idx"} and obj["idx"] == len(v)
    assert obj["idx2word"]["0"] == "<pad>"
    assert Vocab.load(tmp_path / "vocab.json") == v


def test_bad_vocab_files(tmp_path):
    (tmp_path / "v.json").write_text("{")
    with pytest.raises(DataError, match=r"v\.json: not valid JSON"):
        Vocab.load(tmp_path / "v.json")
    (tmp_path / "w.json").write_text(json.dumps({"idx2word": {"0": "x"}, "idx": 1}))
    with pytest.raises(DataError, match=r"w\.json: the first four words"):
        Vocab.load(tmp_path / "w.json")
