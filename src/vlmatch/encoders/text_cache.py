"""On-disk cache of a frozen text encoder's outputs, keyed by encoder and caption.

A frozen encoder's token vectors are a pure function of the caption's token ids, so training pays for the
transformer once per caption, not per epoch. Entries are keyed by the SHA-1 of the token ids, in a folder
named by the encoder's hash and truncation length, written in whole safetensors shards (temp file + rename) under
``$VLMATCH_CACHE/text-encoder/``.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
import warnings
import weakref
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..data.resolve import cache_dir
from ..io import atomic_path

SHARD_ENTRIES = 4096  # captions per shard written


def token_key(ids: Tensor) -> bytes:
    return hashlib.sha1(ids.to(torch.int64).cpu().numpy().astype("<i8").tobytes()).digest()


class TextOutputCache:
    """Token vectors per caption (by token-id key) as one flat (rows, H) float32 table with a zero row at its end,
    read from the shards on first use; new entries wait in ``_pending`` until :meth:`flush` writes them as one
    shard. A batch whose captions are all in the table is one gather (:meth:`gather`)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._where: dict[bytes, tuple[int, int]] | None = None  # key -> (first row, rows) in _flat
        self._flat: Tensor | None = None  # (rows + 1, H); the last row is zeros (padding)
        self._pending: dict[bytes, Tensor] = {}
        self._serial = 0
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().flush())

    def _load(self) -> dict[bytes, tuple[int, int]]:
        if self._where is None:
            self._where, parts, rows, width = {}, [], 0, None
            for shard in sorted(self.directory.glob("shard-*.safetensors")):
                got = _read_shard(shard, width)
                if got is None:
                    continue
                keys, offsets, data = got
                width = data.shape[1]
                for r in range(len(keys)):
                    self._where.setdefault(keys[r].tobytes(), (rows + offsets[r], offsets[r + 1] - offsets[r]))
                parts.append(data)
                rows += len(data)
            self._set_table(parts, width)
        return self._where

    def _set_table(self, parts: list[Tensor], width: int | None) -> None:
        if width is None:
            self._flat = None
            return
        self._flat = torch.cat([*parts, torch.zeros(1, width)])

    def __len__(self) -> int:
        return len(self._load()) + len(self._pending)

    def __contains__(self, key: bytes) -> bool:
        return key in self._load() or key in self._pending

    def get(self, key: bytes) -> Tensor | None:
        where = self._load().get(key)
        if where is not None:
            return self._flat[where[0]:where[0] + where[1]]
        return self._pending.get(key)

    def put(self, key: bytes, value: Tensor) -> None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        if self._flat is not None and value.shape[-1] != self._flat.shape[1]:
            raise ValueError(f"cache {self.directory}: entries have width {self._flat.shape[1]}, not {value.shape[-1]}")
        if key in self._load():
            return
        self._pending[key] = value
        if len(self._pending) >= SHARD_ENTRIES:
            self.flush()

    def flush(self) -> None:
        """Write pending entries as one shard and join them to the table."""
        if not self._pending:
            return
        self._load()  # the table of the shards already there (before this one is written)
        keys = list(self._pending)
        vals = [self._pending[k] for k in keys]
        offsets = np.cumsum([0] + [len(v) for v in vals])
        self._serial += 1
        name = f"shard-{time.time_ns()}-{os.getpid()}-{self._serial}.safetensors"
        data = torch.cat(vals)
        with atomic_path(self.directory / name) as tmp:
            key_rows = np.frombuffer(bytearray(b"".join(keys)), dtype=np.uint8).reshape(len(keys), -1)
            save_file({"keys": torch.from_numpy(key_rows),
                       "offsets": torch.from_numpy(offsets.astype(np.int64)),
                       "data": data}, str(tmp))
        base = 0 if self._flat is None else len(self._flat) - 1
        for k, a, b in zip(keys, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            self._where[k] = (base + a, b - a)
        self._set_table([data] if self._flat is None else [self._flat[:-1], data], data.shape[1])
        self._pending.clear()

    def gather(self, keys: list[bytes], length: int) -> Tensor | None:
        """(len(keys), length, H) token vectors, zero past each caption, as one indexing of the table;
        None unless every key is in the table (flushed)."""
        where = self._load()
        if self._flat is None:
            return None
        try:
            spans = torch.tensor([where[k] for k in keys], dtype=torch.int64)
        except KeyError:
            return None
        cols = torch.arange(length)
        rows = spans[:, :1] + cols[None, :]
        rows = torch.where(cols[None, :] < spans[:, 1:], rows, len(self._flat) - 1)  # the zero row
        return self._flat[rows]


def _read_shard(shard: Path, width: int | None) -> tuple[np.ndarray, list[int], Tensor] | None:
    """A shard's (keys, offsets, data) if it is whole and consistent, else None with a warning: a foreign
    or damaged file is skipped, and its entries are computed again."""
    try:
        t = load_file(str(shard))
        keys, offsets, data = t["keys"], t["offsets"], t["data"]
        problem = None
        if keys.dim() != 2 or keys.dtype != torch.uint8 or keys.shape[1] != 20:
            problem = "keys are not 20-byte rows"
        elif offsets.dim() != 1 or len(offsets) != len(keys) + 1 or offsets.dtype != torch.int64:
            problem = "offsets do not match the keys"
        elif data.dim() != 2 or data.dtype != torch.float32 or (width is not None and data.shape[1] != width):
            problem = f"data is not float32 rows of width {width or 'H'}"
        elif int(offsets[0]) != 0 or int(offsets[-1]) != len(data) or bool((offsets[1:] < offsets[:-1]).any()):
            problem = "offsets do not cover the data"
    except Exception as e:  # safetensors raises its own error types; a missing tensor is a KeyError
        problem = f"not a readable cache shard ({type(e).__name__})"
    if problem:
        warnings.warn(f"text-encoder cache {shard}: {problem}; ignored (its entries are computed again)",
                      stacklevel=3)
        return None
    return keys.numpy(), offsets.tolist(), data


_OPEN: dict[str, TextOutputCache] = {}


def open_cache(name: str) -> TextOutputCache:
    """The process-wide cache object for folder ``$VLMATCH_CACHE/text-encoder/name`` (one per folder)."""
    path = cache_dir() / "text-encoder" / name
    key = str(path)
    if key not in _OPEN:
        _OPEN[key] = TextOutputCache(path)
    return _OPEN[key]


def cached_outputs(encode, cache: TextOutputCache, tokens: Tensor, lengths: Tensor,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """``encode(tokens, lengths)`` -> (B, L, H) through ``cache``: only captions not seen before are
    encoded (as one batch); the result is zero beyond each caption's length, like ``encode``'s. When every
    caption is in the cache's table (the training path after :func:`prefill`) it is one gather."""
    lens = lengths.tolist()
    keys = [token_key(tokens[r, :n]) for r, n in enumerate(lens)]
    table = cache.gather(keys, tokens.shape[1])
    if table is not None:
        return table.to(dtype=dtype, device=tokens.device)
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


def prefill(encode, cache: TextOutputCache, token_lists: list[list[int]], batch_size: int = 256,
            progress: bool = False) -> int:
    """Encode every caption of ``token_lists`` not yet cached (batches of similar length, so little
    padding), write them, and join them to the table, so later batches are single gathers. Returns the
    number of captions encoded."""
    from tqdm.auto import tqdm

    from ..data.loaders import pad_tokens

    todo: dict[bytes, list[int]] = {}
    for ids in token_lists:
        key = token_key(torch.tensor(ids, dtype=torch.int64))
        if key not in cache and key not in todo:
            todo[key] = ids
    order = sorted(todo, key=lambda k: len(todo[k]))
    with torch.no_grad():
        for a in tqdm(range(0, len(order), batch_size), desc="text encoder", disable=not progress, leave=False,
                      unit_scale=batch_size, unit="caption"):
            chunk = order[a:a + batch_size]
            tokens, lengths = pad_tokens([todo[k] for k in chunk])
            out = encode(tokens, lengths)
            for i, k in enumerate(chunk):
                cache.put(k, out[i, : int(lengths[i])])
    cache.flush()
    return len(order)
