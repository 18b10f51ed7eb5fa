"""Trained models that ship with vlmatch: the one source of truth for their names, weights and figures.

``registry.json`` (beside this file) lists every shipped model: its name, registered model and config,
the SHA-256 of its weights, the image features it expects (backbone, input size, normalisation, grid),
its text encoder, its role in search (``retriever``: a global embedding for stage 1; ``rescorer``: the
pair score of stage 2), the data it was trained on with its licence terms, the exact command that
trained it, and its measured val recalls. The weights are ordinary checkpoint folders under
``weights/<name>/`` (only trained parameters: the image backbone and the text transformer come from
their own packages), so ``load_model("pretrained:NAME")`` and ``--model pretrained:NAME`` work wherever a
checkpoint folder does. A weights file whose SHA-256 is not the registry's is refused.
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
    # its query-bank calibration (vlmatch.models.calibration), when it ships one: {"method", "beta", "banks",
    # "sha256" of calibration.safetensors, "uncalibrated": val recalls without it}; ``val`` holds the calibrated ones
    calibration: dict = field(default_factory=dict)
    # its own threshold for `vlmatch index duplicates` (the cosine of two photos' stage-1 image embeddings at or
    # above which they are copies): {"threshold", "pair_precision", "pair_recall" (on the held-out half), "results"}
    duplicates: dict = field(default_factory=dict)
    # the SHA-256 of weights/<name>/checksums.json, which lists every file of the folder (vlmatch.checkpoints.seal)
    checksums_sha256: str = ""
    # its open-vocabulary fusion (vlmatch.search.open_vocab.Fusion: w0, slope, ratio, words, concepts) and the
    # results row it was chosen in; empty: it searches by its own score alone
    open_vocab: dict = field(default_factory=dict)
    # what was chosen on the val data its figures are measured on, and among how many candidates: [{"what",
    # "among" (a count, or the candidate runs' names), "by", "cross_fitted"}] (release/check.selection_record)
    selected: list = field(default_factory=list)

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
    if entry.calibration and (not cal.is_file() or sha256_file(cal) != entry.calibration.get("sha256")):
        raise DataError(cal, f"{'not found' if not cal.is_file() else 'not the file the registry records'} for "
                             f"pretrained model {name!r}: the file was changed or damaged; reinstall vlmatch")
    if not entry.calibration and cal.is_file():
        raise DataError(cal, f"the registry records no calibration for pretrained model {name!r}; reinstall vlmatch")
    sums = entry.folder / CHECKSUMS
    if not sums.is_file() or sha256_file(sums) != entry.checksums_sha256:
        raise DataError(sums, f"{'not found' if not sums.is_file() else 'not the file the registry records'} for "
                              f"pretrained model {name!r}: the file was changed or damaged; reinstall vlmatch")
    return entry.folder  # load_model checks every file of the folder against it


def _defaults() -> dict[str, Pretrained]:
    """The default entry of each role (the registry marks at most one per role)."""
    return {e.role: e for e in entries() if e.default}


def default_pair() -> tuple[str, str | None]:
    """(model, retriever) of the shipped default search pair: the default re-scorer with the default retriever
    as its stage 1; while no re-scorer ships, the default retriever alone (its own stage 1 and 2), retriever None."""
    chosen = _defaults()
    if "rescorer" in chosen:
        if "retriever" not in chosen:
            raise ConfigError("the shipped default re-scorer has no default retriever: give --model and --retriever")
        return chosen["rescorer"].name, chosen["retriever"].name
    if "retriever" in chosen:
        return chosen["retriever"].name, None
    raise ConfigError("this vlmatch ships no default model: give --model (and --retriever) checkpoints")


def default_explainer() -> tuple[str, str]:
    """(name, method) of the shipped default explainer: the entry whose ``explainer`` is marked default (the
    model and method that point best on Flickr8k val, experiments/results/grounding.md), else the default
    re-scorer (or retriever) with its ``explainer`` method or attention."""
    marked = [e for e in entries() if e.explainer.get("default")]
    if marked:
        return marked[0].name, marked[0].explainer["method"]
    model, _ = default_pair()
    return model, get(model).explainer.get("method", "attention")


def explainer_record(checkpoint) -> dict | None:
    """The ``explainer`` record ({method, pointing, ...}) of the shipped model whose weights a checkpoint folder
    holds (matched by the ``weights_sha256`` of its config.json, which ``load_model`` checks against the
    weights), or None for a model that does not ship or records none."""
    cfg = Path(checkpoint) / "config.json"
    try:
        digest = json.loads(cfg.read_text(encoding="utf-8")).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    found = [e for e in entries() if e.sha256 == digest and e.explainer.get("pointing") is not None]
    return dict(found[0].explainer) if found else None


def open_vocab_record(checkpoint=None, *, weights_sha256: str | None = None) -> dict | None:
    """The ``open_vocab`` fusion record of the shipped model whose weights a checkpoint folder holds (matched as
    :func:`explainer_record` matches) or whose model.safetensors has SHA-256 ``weights_sha256`` (an index's
    manifest records its model's so), or None."""
    if weights_sha256 is None and checkpoint is not None:
        try:
            cfg = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
            weights_sha256 = cfg.get("weights_sha256")
        except (OSError, ValueError, AttributeError):
            return None
    found = [e for e in entries() if weights_sha256 and e.sha256 == weights_sha256 and e.open_vocab]
    return dict(found[0].open_vocab) if found else None


def duplicates_record(weights_sha256: str | None) -> dict | None:
    """The ``duplicates`` record ({threshold, pair_precision, pair_recall, results}) of the shipped model with
    these weights (an index manifest's ``sha256`` of its stage-1 model), or None."""
    found = [e for e in entries() if weights_sha256 and e.sha256 == weights_sha256 and e.duplicates.get("threshold")]
    return dict(found[0].duplicates) if found else None


def default_score() -> str:
    """Stage 2's ranking score of the shipped default pair (``index build --score``): the default re-scorer's
    ``pair_score`` ("mean": its score averaged with the retriever's), or "model" when no re-scorer ships."""
    chosen = _defaults()
    return chosen["rescorer"].pair_score if "rescorer" in chosen and "retriever" in chosen else "model"


register_resolver(PREFIX, checkpoint_dir)
