"""On-disk cache of a frozen text encoder's outputs, keyed by encoder and caption.

A frozen encoder's token vectors E are a pure function of the caption's token ids, so training
and evaluation pay for the transformer once per caption, not once per epoch. Entries are keyed
by the SHA-1 of the caption's token ids; the folder is named by the encoder's hash (see
``vlmatch.encoders.hf.encoder_hash``) and the tokenizer's truncation length, so two encoders never
share entries. New entries are written in shards (safetensors: keys, offsets, flat float32 data)
through vlmatch.io's temp-file + rename, so concurrent processes and crashes leave only whole shards.

Location: ``$VLMATCH_CACHE/text-encoder/<hash>`` (default ``~/.cache/vlmatch``).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
import weakref
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..io import atomic_path

SHARD_ENTRIES = 4096  # captions per shard written


def cache_root() -> Path:
    return Path(os.environ.get("VLMATCH_CACHE", Path.home() / ".cache" / "vlmatch")) / "text-encoder"


def token_key(ids: Tensor) -> bytes:
    return hashlib.sha1(ids.to(torch.int64).cpu().numpy().astype("<i8").tobytes()).digest()


class TextOutputCache:
    """Token vectors per caption (by token-id key); shards loaded on first use, appended as they fill."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._entries: dict[bytes, Tensor] | None = None
        self._pending: dict[bytes, Tensor] = {}
        self._serial = 0
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().flush())

    def _load(self) -> dict[bytes, Tensor]:
        if self._entries is None:
            self._entries = {}
            for shard in sorted(self.directory.glob("shard-*.safetensors")):
                try:
                    t = load_file(str(shard))
                except Exception:  # a foreign or damaged file: ignore it, the entries are recomputed
                    continue
                keys, offsets, data = t["keys"].numpy(), t["offsets"].tolist(), t["data"]
                for r in range(len(keys)):
                    self._entries[keys[r].tobytes()] = data[offsets[r]:offsets[r + 1]]
        return self._entries

    def __len__(self) -> int:
        return len(self._load())

    def get(self, key: bytes) -> Tensor | None:
        return self._load().get(key)

    def put(self, key: bytes, value: Tensor) -> None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._load()[key] = value
        self._pending[key] = value
        if len(self._pending) >= SHARD_ENTRIES:
            self.flush()

    def flush(self) -> None:
        """Write pending entries as one shard."""
        if not self._pending:
            return
        keys = list(self._pending)
        vals = [self._pending[k] for k in keys]
        offsets = np.cumsum([0] + [len(v) for v in vals])
        self._serial += 1
        name = f"shard-{time.time_ns()}-{os.getpid()}-{self._serial}.safetensors"
        with atomic_path(self.directory / name) as tmp:
            key_rows = np.frombuffer(bytearray(b"".join(keys)), dtype=np.uint8).reshape(len(keys), -1)
            save_file({"keys": torch.from_numpy(key_rows),
                       "offsets": torch.from_numpy(offsets.astype(np.int64)),
                       "data": torch.cat(vals)}, str(tmp))
        self._pending.clear()


_OPEN: dict[str, TextOutputCache] = {}


def open_cache(name: str) -> TextOutputCache:
    """The process-wide cache object for folder ``cache_root()/name`` (one per folder)."""
    path = cache_root() / name
    key = str(path)
    if key not in _OPEN:
        _OPEN[key] = TextOutputCache(path)
    return _OPEN[key]


def cached_outputs(encode, cache: TextOutputCache, tokens: Tensor, lengths: Tensor,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """``encode(tokens, lengths)`` -> (B, L, H) through ``cache``: only captions not seen before are
    encoded (as one batch); the result is zero beyond each caption's length, like ``encode``'s."""
    lens = lengths.tolist()
    keys = [token_key(tokens[r, :n]) for r, n in enumerate(lens)]
    rows: list[Tensor | None] = [cache.get(k) for k in keys]
    miss = [r for r, v in enumerate(rows) if v is None]
    if miss:
        mlen = lengths[miss]
        out = encode(tokens[miss][:, : int(mlen.max())], mlen)
        for i, r in enumerate(miss):
            cache.put(keys[r], out[i, : lens[r]])
            rows[r] = cache.get(keys[r])  # the stored float32 copy: a hit and a miss give the same values
    hidden = rows[0].shape[-1]
    full = torch.zeros(len(lens), tokens.shape[1], hidden, dtype=dtype)
    for r, v in enumerate(rows):
        full[r, : lens[r]] = v.to(dtype)
    return full.to(tokens.device)
