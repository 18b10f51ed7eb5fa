"""Trained models that ship with vlmatch: ``registry.json`` (beside this file) is the one source of their names,
weights' SHA-256, features, text encoder, role in search, data and licence, training command and val figures. Their
weights are checkpoint folders under ``weights/<name>/``, so ``pretrained:NAME`` works wherever a checkpoint folder
does; a file whose SHA-256 is not the registry's is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoints.read import register_resolver
from ..checkpoints.seal import CHECKSUMS
from ..errors import ConfigError, DataError
from ..weights import sha256_file

HERE = Path(__file__).resolve().parent
REGISTRY = HERE / "registry.json"
WEIGHTS = HERE / "weights"
PREFIX = "pretrained:"


@dataclass(frozen=True)
class Pretrained:
    """One shipped model (the fields of its registry.json entry)."""

    name: str
    model: str
    role: str  # "retriever" (stage 1) or "rescorer" (stage 2)
    sha256: str  # of weights/<name>/model.safetensors
    val_rsum: float
    config: dict = field(default_factory=dict)
    features: dict = field(default_factory=dict)
    text_encoder: str = ""
    data: str = ""
    licence: str = ""
    command: str = ""
    val: dict = field(default_factory=dict)
    storage: str = "float16"
    ms_per_query: float | None = None
    search: dict = field(default_factory=dict)  # figures of benchmarks/search.py with the default pair
    pair_score: str = "model"  # a re-scorer's stage-2 score in the default pair: "model", or "mean" with the retriever's
    notes: str = ""
    default: bool = False
    explainer: dict = field(default_factory=dict)  # {"method", "default", pointing figures on Flickr8k val}
    calibration: dict = field(default_factory=dict)  # {"method", "beta", "banks", "sha256", "uncalibrated": recalls}
    duplicates: dict = field(default_factory=dict)  # `index duplicates`: {"threshold", "pair_precision", ...}
    checksums_sha256: str = ""  # of weights/<name>/checksums.json
    open_vocab: dict = field(default_factory=dict)  # its open-vocabulary fusion (empty: its own score alone)
    selected: list = field(default_factory=list)  # what was chosen on val, among how many (release/check.py)

    @property
    def folder(self) -> Path:
        return WEIGHTS / self.name

    @property
    def megabytes(self) -> float:
        return sum(f.stat().st_size for f in self.folder.rglob("*") if f.is_file()) / 1e6


def entries() -> list[Pretrained]:
    """Every registry entry, in the registry's order."""
    if not REGISTRY.is_file():
        return []
    try:
        raw = json.loads(REGISTRY.read_text(encoding="utf-8"))
        return [Pretrained(**e) for e in raw]
    except (ValueError, TypeError) as e:
        raise DataError(REGISTRY, f"not a valid registry of pretrained models: {e}") from None


def get(name: str) -> Pretrained:
    found = {e.name: e for e in entries()}
    if name not in found:
        known = ", ".join(found) or "none are installed"
        raise ConfigError(f"no pretrained model {name!r}; shipped: {known} (see `vlmatch pretrained`)")
    return found[name]


def checkpoint_dir(name: str) -> Path:
    """The checkpoint folder of shipped model ``name``, after checking its weights against the registry."""
    entry = get(name)
    weights = entry.folder / "model.safetensors"
    if not weights.is_file():
        raise DataError(weights, f"not found: the pretrained model {name!r} is not installed with this package")
    have = sha256_file(weights)
    if have != entry.sha256:
        raise DataError(weights, f"SHA-256 {have[:12]}... is not the registry's {entry.sha256[:12]}... for pretrained "
                                 f"model {name!r}: the file was changed or damaged; reinstall vlmatch")
    cal = entry.folder / "calibration.safetensors"
    if entry.calibration:
        _check_recorded(cal, entry.calibration.get("sha256"), name)
    elif cal.is_file():
        raise DataError(cal, f"the registry records no calibration for pretrained model {name!r}; reinstall vlmatch")
    _check_recorded(entry.folder / CHECKSUMS, entry.checksums_sha256, name)
    return entry.folder  # load_model checks every file of the folder against it


def _check_recorded(path: Path, sha256: str | None, name: str) -> None:
    if not path.is_file() or sha256_file(path) != sha256:
        raise DataError(path, f"{'not found' if not path.is_file() else 'not the file the registry records'} for "
                              f"pretrained model {name!r}: the file was changed or damaged; reinstall vlmatch")


def _defaults() -> dict[str, Pretrained]:
    """The default entry of each role (the registry marks at most one per role)."""
    return {e.role: e for e in entries() if e.default}


def default_pair() -> tuple[str, str | None]:
    """(model, retriever) of the shipped default search pair: the default re-scorer and retriever, or while no
    re-scorer ships the default retriever alone (retriever None)."""
    chosen = _defaults()
    if "rescorer" in chosen:
        if "retriever" not in chosen:
            raise ConfigError("the shipped default re-scorer has no default retriever: give --model and --retriever")
        return chosen["rescorer"].name, chosen["retriever"].name
    if "retriever" in chosen:
        return chosen["retriever"].name, None
    raise ConfigError("this vlmatch ships no default model: give --model (and --retriever) checkpoints")


def default_explainer() -> tuple[str, str]:
    """(name, method) of the shipped default explainer: the entry whose ``explainer`` is marked default, else the
    default pair's model with its ``explainer`` method or attention."""
    marked = [e for e in entries() if e.explainer.get("default")]
    if marked:
        return marked[0].name, marked[0].explainer["method"]
    model, _ = default_pair()
    return model, get(model).explainer.get("method", "attention")


def explainer_record(checkpoint) -> dict | None:
    """The ``explainer`` record of the shipped model whose weights a checkpoint folder holds (by its config.json's
    ``weights_sha256``), or None."""
    return _record(_weights_sha256(checkpoint), "explainer", lambda x: x.get("pointing") is not None)


def _weights_sha256(checkpoint) -> str | None:
    try:
        return json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8")).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _record(weights_sha256: str | None, key: str, present) -> dict | None:
    """The ``key`` record of the shipped model with these weights where ``present(record)``, or None."""
    found = [e for e in entries() if weights_sha256 and e.sha256 == weights_sha256 and present(getattr(e, key))]
    return dict(getattr(found[0], key)) if found else None


def open_vocab_record(checkpoint=None, *, weights_sha256: str | None = None) -> dict | None:
    """The ``open_vocab`` fusion record of the shipped model whose weights a checkpoint folder holds, or whose
    weights have SHA-256 ``weights_sha256``, or None."""
    if weights_sha256 is None and checkpoint is not None:
        weights_sha256 = _weights_sha256(checkpoint)
    return _record(weights_sha256, "open_vocab", bool)


def duplicates_record(weights_sha256: str | None) -> dict | None:
    """The ``duplicates`` record of the shipped model with these weights, or None."""
    return _record(weights_sha256, "duplicates", lambda d: d.get("threshold"))


def default_score() -> str:
    """Stage 2's ranking score of the shipped default pair: the default re-scorer's ``pair_score``, else "model"."""
    chosen = _defaults()
    return chosen["rescorer"].pair_score if "rescorer" in chosen and "retriever" in chosen else "model"


register_resolver(PREFIX, checkpoint_dir)
