"""The ``text_encoder`` option of every model whose paper uses a recurrent text encoder.

``gru`` (the default) keeps the paper's encoder over learned word embeddings; ``minilm`` or the path of a local
BERT-family folder replaces it with :class:`vlmatch.encoders.pretrained_text.PretrainedWords` (frozen and cached,
``finetune``, or ``text_lora`` adapters: :mod:`vlmatch.encoders.lora`). A model inherits :class:`TextSideOptions`
in its Config and :class:`TextSide` before :class:`MatchingModel`, and builds its text side with
:meth:`TextSide.make_text_side`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from ..encoders.text import GRUTextEncoder
from ..options import option

GRU = "gru"


@dataclass
class TextSideOptions:
    text_encoder: str = option(GRU, doc="'gru': the paper's recurrent encoder over learned word embeddings; "
                                        "'minilm': the packaged all-MiniLM-L6-v2; or a local Hugging Face folder")
    finetune: bool = option(False, doc="with a transformer text side: train the transformer too (no output cache)")
    text_cache: bool = option(True, doc="with a frozen transformer: cache its token outputs on disk")
    text_context: bool = option(True, doc="with a transformer: its contextual output token vectors (False: its input "
                                          "embeddings, word-level: each token alone, no sentence context)")
    max_tokens: int = option(64, min=3, max=4096, doc="with a transformer: WordPiece tokens per caption, "
                                                        "[CLS] and [SEP] included")
    text_lora: dict | None = option(None, doc="with a transformer: train low-rank adapters on its frozen weights, "
                                              "{rank, targets, alpha} (encoders/lora.py); only they are saved")

    def __post_init__(self):
        from ..encoders.lora import parse_lora

        spec = parse_lora(self.text_lora)
        if spec is not None:
            if not uses_transformer(self):
                raise ValueError("text_lora adapts a pretrained transformer: it needs text_encoder: minilm (or a "
                                 "local Hugging Face folder), not the GRU")
            if self.finetune:
                raise ValueError("text_lora trains adapters on a frozen transformer: it excludes finetune: true")
            if not self.text_context:
                raise ValueError("text_lora adapts the transformer's layers, which text_context: false skips")


def uses_transformer(options) -> bool:
    """Whether a config (a TextSideOptions or an options dict) asks for a pretrained transformer."""
    value = options.get("text_encoder", GRU) if isinstance(options, dict) else options.text_encoder
    return str(value) != GRU


class TextSide:
    """Mixin for models with the ``text_encoder`` option: tokenisation, decoding and checkpoint files
    follow the chosen encoder. Put it before MatchingModel in the bases."""

    @classmethod
    def needs_vocab(cls, options: dict) -> bool:
        return not uses_transformer(options)

    def make_text_side(self, gru: Callable[[], nn.Module] | None = None, dropout: float = 0.0) -> nn.Module:
        """The text side: ``gru()`` (the paper's encoder; default: a GRUTextEncoder of the config's ``bi_gru`` and
        ``num_layers``) or a PretrainedWords, either of width ``embed_dim``."""
        cfg = self.cfg
        self.uses_vocab = not uses_transformer(cfg)
        object.__setattr__(self, "pretrained_text", None)  # a plain reference: the caller registers the module
        if self.uses_vocab:
            return gru() if gru else GRUTextEncoder(cfg.vocab_size, cfg.word_dim, cfg.embed_dim, cfg.num_layers, cfg.bi_gru)
        from ..encoders.lora import parse_lora
        from ..encoders.pretrained_text import PretrainedWords

        enc = PretrainedWords(cfg.text_encoder, cfg.embed_dim, finetune=cfg.finetune, cache=cfg.text_cache,
                              max_tokens=cfg.max_tokens, dropout=dropout, context=cfg.text_context,
                              lora=parse_lora(cfg.text_lora))
        object.__setattr__(self, "pretrained_text", enc)
        return enc

    def tokenize(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        if self.pretrained_text is not None:
            return self.pretrained_text.hf.tokenize(captions)
        return super().tokenize(captions)

    def decode_tokens(self, tokens: Tensor, length: int) -> list[str]:
        if self.pretrained_text is not None:
            return self.pretrained_text.hf.decode(tokens, length)
        return super().decode_tokens(tokens, length)

    def prepare_captions(self, token_lists: list[list[int]], progress: bool = False) -> None:
        side = self.pretrained_text
        if side is not None and side.cache and side.context and side.hf.cacheable:
            side.hf.prefill(token_lists, progress)

    def save_extra(self, directory: Path) -> None:
        if self.pretrained_text is not None:
            self.pretrained_text.hf.save_record(directory)

    def load_extra(self, directory: Path) -> None:
        if self.pretrained_text is not None:
            self.pretrained_text.hf.check_record(directory)
