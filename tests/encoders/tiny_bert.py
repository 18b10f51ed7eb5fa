"""A tiny randomly initialised BERT folder, the text encoder of the tests that need a transformer."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch

from vlmatch.encoders.hf import _quiet_transformers


def tiny_bert_folder(directory: str | os.PathLike, hidden: int = 32, layers: int = 2, heads: int = 2,
                     words: tuple[str, ...] = (), seed: int = 0) -> Path:
    """Write a tiny randomly initialised BERT (+ a WordPiece vocabulary of ``words``) to a folder, for tests."""
    transformers = _quiet_transformers()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = list(dict.fromkeys(specials + list(words) + letters + ["##" + c for c in letters] + list(".,0123456789")))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    arg = "vocab_file" if "vocab_file" in inspect.signature(transformers.BertTokenizerFast).parameters else "vocab"
    tok = transformers.BertTokenizerFast(**{arg: str(directory / "vocab.txt")}, do_lower_case=True)  # v4 / v5 names
    tok.save_pretrained(str(directory))
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=128)
    transformers.BertModel(cfg).save_pretrained(str(directory))
    return directory
