"""Weight files: their content hash (checked against what config.json records), their shapes read from the
safetensors header before a model is built, and building a model on the meta device (no memory) to fill from one.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from contextlib import contextmanager
from pathlib import Path

from .errors import DataError


def sha256_file(path) -> str:
    """The SHA-256 of a file's bytes (hex), read in blocks: the one file-hash reader of vlmatch."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hash_file_into(h, path) -> None:
    """Feed the bytes of ``path`` into the running hash ``h`` (a digest over several files)."""
    with open(path, "rb") as f:
        hashlib.file_digest(f, lambda: h)


def verify_sha256(path, expected: str | None, recorded_in, actual: str | None = None) -> None:
    """Refuse ``path`` if its SHA-256 (``actual`` when the caller has it) is not ``expected`` (when given)."""
    if expected is None:
        return
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found")
    actual = actual or sha256_file(path)
    if actual != expected:
        raise DataError(path, f"content does not match the SHA-256 recorded in {Path(recorded_in).name} "
                              f"({actual[:12]}... != {expected[:12]}...): the file is corrupt or was replaced")


def read_header(path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header (no tensor data is read)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "weights file not found")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # safetensors raises its own error types
        raise DataError(path, f"not a readable safetensors file: {e}") from None


def shape_problems(found: dict[str, tuple], expected: dict[str, tuple]) -> list[str]:
    """What differs between the shapes in a file and the shapes a model needs."""
    out = [f"{k}: {tuple(found[k])} in the file, {tuple(v)} needed" for k, v in expected.items()
           if k in found and tuple(found[k]) != tuple(v)]
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    if missing:
        out.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        out.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    return out


def describe_problems(problems: list[str]) -> str:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
          "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


# whether this thread is inside a meta build (initialisers skipped): other threads initialise as usual
_BUILD = threading.local()
_SWITCH_LOCK = threading.Lock()


def _switched(real):
    """``real`` (a ``torch.nn.init`` function) that returns its tensor untouched inside this thread's meta build."""

    @functools.wraps(real)
    def init_fn(tensor, *args, **kwargs):
        if getattr(_BUILD, "meta", False):
            return tensor
        return real(tensor, *args, **kwargs)

    init_fn.vlmatch_switched = True
    return init_fn


_ACTIVE = [0]  # meta builds running in any thread: the switches are in torch.nn.init while it is above 0
_REAL: dict[str, object] = {}  # the initialisers the switches replaced, put back by the last build to end


def _install_switches() -> None:
    """Wrap torch.nn.init's initialisers (calling through outside a meta build) from the first meta build's start
    to the last one's end, when torch's own are put back."""
    from torch.nn import init

    with _SWITCH_LOCK:
        _ACTIVE[0] += 1
        if _ACTIVE[0] > 1:
            return
        for name in _INITS:
            fn = getattr(init, name, None)
            if fn is not None and not getattr(fn, "vlmatch_switched", False):
                _REAL[name] = fn
                setattr(init, name, _switched(fn))


def _remove_switches() -> None:
    from torch.nn import init

    with _SWITCH_LOCK:
        _ACTIVE[0] -= 1
        if _ACTIVE[0] > 0:
            return
        for name, fn in _REAL.items():
            if getattr(getattr(init, name, None), "vlmatch_switched", False):  # not another library's wrapper
                setattr(init, name, fn)
        _REAL.clear()


@contextmanager
def meta_build():
    """Build modules on the meta device (shapes, no memory) with ``torch.nn.init`` skipped in this thread: their
    values come from a weights file, and an initialiser on a meta tensor imports torch's compiler stack (seconds)."""
    _install_switches()
    try:
        with _building(meta=True):
            yield
    finally:
        _remove_switches()


@contextmanager
def real_build():
    """Inside a :func:`meta_build`, build on the CPU with ``torch.nn.init`` working (a frozen pretrained model)."""
    with _building(meta=False):
        yield


@contextmanager
def _building(meta: bool):
    """This thread builds on the meta device, initialisers skipped (``meta``), or on the CPU, until the block ends."""
    import torch

    before = getattr(_BUILD, "meta", False)
    _BUILD.meta = meta
    try:
        with torch.device("meta" if meta else "cpu"):
            yield
    finally:
        _BUILD.meta = before
