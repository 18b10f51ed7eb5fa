"""Encodings on disk: a folder ``enc/`` with one memory-mapped ``{field}.npy`` per tensor field of a model's Encoding
(row i = item i) and ``fields.json`` (names, shapes, dtypes).

Floating fields are stored in the store's dtype (float16 by default) except a model's ``full_precision_fields``
(float32); word-axis fields are zero-padded to the longest caption. Writers preallocate ``{field}.npy.partial``
and write rows in place, so an interrupted build continues where it stopped.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..io import read_json, write_json
from ..models.base import Encoding

FLOAT_DTYPES = ("float16", "float32")


def _not_written(path, e: OSError, size: int) -> DataError:
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    return DataError(path, f"could not be written: {e.strerror or e} ({size / 1e6:.1f} MB needed"
                           + ("; the disk is full): free space and run the command again (what was indexed before is "
                              "as it was)" if full else ")"))


def reserve(path) -> None:
    """Reserve the disk blocks of the whole file ``path`` (``posix_fallocate``) before its memory map is written: a
    page of a memory map that the disk has no room for kills the process (SIGBUS, exit 135, no word), where a
    reservation that fails is an error naming the file. The file systems that cannot reserve are left as they are."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # no reservations here: written as it was
            return
        raise _not_written(path, e, os.fstat(fd).st_size) from None
    finally:
        os.close(fd)


def allocate_npy(path, dtype, shape) -> np.memmap:
    """``np.lib.format.open_memmap(path, mode="w+")`` with the whole file reserved on disk first (:func:`reserve`);
    a disk without room for it is a DataError naming ``path`` (the file removed: nothing to resume from)."""
    try:
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    except OSError as e:  # not even its header fits
        Path(path).unlink(missing_ok=True)
        raise _not_written(path, e, int(np.prod(shape)) * np.dtype(dtype).itemsize) from None
    try:
        reserve(path)
    except DataError:
        del arr
        Path(path).unlink(missing_ok=True)
        raise
    return arr


def field_specs(enc: Encoding, float_dtype: str, pad_to: int | None = None) -> dict[str, dict]:
    """Each tensor field of ``enc`` as stored: ``{"shape": per item, the word axis padded to ``pad_to``, "dtype"}``,
    floats in ``float_dtype`` but the model's ``full_precision_fields`` (float32)."""
    per_word, full, out = getattr(enc, "per_word_fields", ()), type(enc).full_precision_fields, {}
    for name, t in enc.tensors().items():
        shape = list(t.shape[1:])
        if name in per_word and pad_to is not None:
            shape[0] = pad_to
        dt = ("float32" if name in full else float_dtype) if t.dtype.is_floating_point else str(t.dtype).removeprefix("torch.")
        out[name] = {"shape": shape, "dtype": np.dtype(dt).name}
    return out


def check_fields(template: Encoding, stored, where) -> None:
    """Refuse stored encodings that lack a field the model produces (``stored``: the stored field names)."""
    missing = set(template.tensors()) - set(stored)
    if missing:
        raise DataError(where, f"stored encodings lack field(s) {sorted(missing)} the model produces: the index "
                               "was built with another model")


class EncodingWriter:
    """Rows of an Encoding written into preallocated memory-mapped arrays (resumable)."""

    def __init__(self, folder, n: int, float_dtype: str = "float16", pad_to: int | None = None):
        if float_dtype not in FLOAT_DTYPES:
            raise DataError(folder, f"store dtype must be one of {FLOAT_DTYPES}, not {float_dtype!r}")
        self.folder, self.n, self.float_dtype, self.pad_to = Path(folder), n, float_dtype, pad_to
        self.arrays: dict[str, np.memmap] = {}
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "fields.json.partial"
        if meta.is_file():  # resume: reopen what a previous run allocated
            for name in read_json(meta)["fields"]:
                reserve(self.folder / f"{name}.npy.partial")  # a killed run's file may not hold its blocks yet
                self.arrays[name] = np.load(self.folder / f"{name}.npy.partial", mmap_mode="r+")

    def _allocate(self, enc: Encoding) -> None:
        fields = field_specs(enc, self.float_dtype, self.pad_to)
        for name, f in fields.items():
            self.arrays[name] = allocate_npy(self.folder / f"{name}.npy.partial", f["dtype"], (self.n, *f["shape"]))
        write_json(self.folder / "fields.json.partial", {"fields": fields, "class": type(enc).__name__})

    def write(self, start: int, enc: Encoding) -> None:
        per_word = getattr(enc, "per_word_fields", ())
        if not self.arrays:
            self._allocate(enc)
        for name, t in enc.tensors().items():
            a = t.detach().cpu().numpy()
            dst = self.arrays[name]
            with np.errstate(over="ignore"):  # a value float16 cannot hold is refused just below
                if name in per_word:
                    dst[start:start + len(a), :a.shape[1]] = a
                else:
                    dst[start:start + len(a)] = a
            if dst.dtype.kind == "f" and not np.isfinite(dst[start:start + len(a)]).all():
                raise DataError(self.folder / f"{name}.npy", f"NaN or inf in the encodings of rows {start}.."
                                f"{start + len(a) - 1} (as {dst.dtype.name}): the model's output cannot be stored")

    def flush(self) -> None:
        for a in self.arrays.values():
            a.flush()

    def finish(self, rows: int | None = None) -> None:
        """Close the arrays (keeping the first ``rows`` when fewer than allocated) and drop .partial."""
        self.flush()
        for name in list(self.arrays):
            arr = self.arrays.pop(name)
            if rows is not None and rows < self.n:
                small = allocate_npy(self.folder / f"{name}.npy.cut", arr.dtype, (rows, *arr.shape[1:]))
                small[:] = arr[:rows]
                small.flush()
                del small, arr
                os.replace(self.folder / f"{name}.npy.cut", self.folder / f"{name}.npy")
                (self.folder / f"{name}.npy.partial").unlink()
            else:
                del arr
                os.replace(self.folder / f"{name}.npy.partial", self.folder / f"{name}.npy")
        meta = self.folder / "fields.json.partial"
        if meta.is_file():
            os.replace(meta, self.folder / "fields.json")


def open_arrays(folder) -> tuple[dict, dict[str, np.ndarray]]:
    """A store's ``fields.json`` and its arrays, memory-mapped, each checked against the shape and
    dtype fields.json records, all with one number of rows (the arrays are too large to hash)."""
    folder = Path(folder)
    meta = read_json(folder / "fields.json", "encodings missing (incomplete index?)")
    arrays = {}
    for name, spec in meta["fields"].items():
        path = folder / f"{name}.npy"
        try:
            arrays[name] = arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(path, f"unreadable encoding array ({e})") from None
        if list(arr.shape[1:]) != list(spec["shape"]) or arr.dtype.name != spec["dtype"]:
            raise DataError(path, f"{arr.dtype.name} {list(arr.shape[1:])} per row, but fields.json records "
                                  f"{spec['dtype']} {spec['shape']}")
    if len({len(a) for a in arrays.values()}) > 1:
        rows = {n: len(a) for n, a in arrays.items()}
        raise DataError(folder, f"the encoding arrays have different numbers of rows: {rows}")
    return meta, arrays


class EncodingStore:
    """Read side: memory-mapped fields, rows gathered into an Encoding of the model's class."""

    def __init__(self, folder, template: Encoding):
        self.folder = Path(folder)
        meta, self.arrays = open_arrays(self.folder)
        self.fields = meta["fields"]
        self.cls = type(template)
        check_fields(template, self.fields, self.folder)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    @property
    def dtype(self) -> str:
        floats = {f["dtype"] for f in self.fields.values() if f["dtype"].startswith("float")}
        return "float16" if "float16" in floats else "float32"  # full-precision fields aside

    def take(self, rows) -> Encoding:
        """Rows (an int array, a slice) as float32 torch tensors in the model's Encoding class.
        A NaN or inf read back is an error naming the file: a build never stores one."""
        out = {}
        for name, arr in self.arrays.items():
            a = torch.from_numpy(np.ascontiguousarray(arr[rows]))
            # torch's half -> float conversion is vectorised (F16C); numpy's astype is ~10x slower
            if a.is_floating_point():
                a = a.float()
                if not torch.isfinite(a.sum()):  # one cheap pass: a NaN or inf carries through the sum
                    bad = np.arange(len(arr))[rows][~torch.isfinite(a.reshape(len(a), -1)).all(1).numpy()]
                    if len(bad):
                        raise DataError(self.folder / f"{name}.npy", f"NaN or inf in stored row(s) {bad[:5].tolist()}: "
                                                                     "the index is corrupt; build it again")
            out[name] = a
        return self.cls(**out)

    def close(self) -> None:
        self.arrays.clear()
