"""Score calibration against a query bank: the inverted softmax (QB-Norm's IS form) in both directions.

Hubs (images close to nearly every caption, and captions to nearly every image) come back for queries they do
not match. The inverted softmax (Smith et al., ICLR 2017; QB-Norm, Bogolin et al., CVPR 2022) normalises every
gallery item by how well it matches a bank of typical queries (training captions for images, training images
for captions). Ranking by p(I | T) = exp(beta s(I, T)) / Σ_b exp(beta s(I, b)) is ranking by

    s'(I, T) = s(I, T) - c(I) - d(T),   c(I) = (1 / beta) log( (1/m) Σ_{b=1..m} exp(beta s(I, b)) )

(d(T) likewise with the image bank; an item's own offset is a constant of its query's ranking), so one matrix
gives both directions. An offset depends on one item, so it is computed when the item is encoded, and with a
global-vector model the calibrated score is again one inner product, ``[v, -c(I), 1] . [t, 1, -d(T)]``.

A bank is ``rows`` random training items in the ``rank`` leading directions of their SVD, each row's
coefficients int8 with one float16 scale. Files: ``calibration.safetensors`` (``{side}_coef``, ``{side}_scale``,
``{side}_basis``) and ``calibration.json`` (beta, each bank's rows, rank and source, the safetensors file's
SHA-256, and ``weights_sha256``, the weights the banks were encoded with: refused beside any other weights).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from ..errors import ConfigError, DataError
from ..io import read_json, write_bytes, write_json
from ..weights import verify_sha256

FILE = "calibration.safetensors"
RECORD = "calibration.json"
METHOD = "inverted softmax (QB-Norm's IS), both directions"
# the name calibrations saved before were recorded with (the same method; the shipped ones keep it in their files)
METHODS = (METHOD, "dual inverted softmax")
SIDES = ("text", "image")  # the text bank calibrates images, the image bank captions


def bank_offsets(bank: Tensor, emb: Tensor, beta: float) -> Tensor:
    """c(x) = (1/beta) log((1/m) sum_b exp(beta <b, x>)) for each row x of ``emb`` (n, d): (n,)."""
    dt = torch.promote_types(emb.dtype, torch.float32)  # float16 encodings: offsets in float32
    logits = beta * (emb.to(dt) @ bank.to(dt).T)
    return (torch.logsumexp(logits, dim=1) - math.log(bank.shape[0])) / beta


def compress(bank: Tensor, rank: int) -> dict[str, Tensor]:
    """A bank (m, d) as int8 coefficients (m, r) with a float16 scale per row, in the float16 basis (r, d)
    of its ``rank`` leading right singular vectors."""
    bank = bank.float()
    r = min(rank, *bank.shape)
    _, _, vh = torch.linalg.svd(bank, full_matrices=False)
    basis = vh[:r].half().contiguous()  # as stored: expanding it gives the loaded bank bit for bit
    coef = bank @ basis.float().T
    scale = (coef.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(coef / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return {"coef": q, "scale": scale.half(), "basis": basis}


def expand(parts: dict[str, Tensor]) -> Tensor:
    """The bank (m, d) float32 that :func:`compress` stored."""
    return (parts["coef"].float() * parts["scale"].float()[:, None]) @ parts["basis"].float()


@dataclass
class Calibration:
    """Banks of training embeddings and the inverse temperature ``beta`` (see the module doc).
    ``text_bank`` (m, d): caption embeddings, which give each image its offset; ``image_bank``: image
    embeddings, which give each caption its offset. Either may be None (that side gets no offset)."""

    beta: float
    text_bank: Tensor | None = None
    image_bank: Tensor | None = None
    sources: dict = field(default_factory=dict)  # side -> {"rows", "rank", "source"}
    stored: dict = field(default_factory=dict, repr=False)  # side -> the compressed parts the banks came from
    weights_sha256: str | None = None  # the weights it was fitted for (None: an older record)

    def __post_init__(self):
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ConfigError(f"calibration beta must be a positive number, not {self.beta}")
        if self.text_bank is None and self.image_bank is None:
            raise ConfigError("a calibration needs a text bank, an image bank or both")

    def image_offsets(self, emb: Tensor) -> Tensor | None:
        """c(I) of each image embedding (n, d), or None without a text bank."""
        return self._offsets(self.text_bank, emb)

    def text_offsets(self, emb: Tensor) -> Tensor | None:
        """d(T) of each caption embedding (n, d), or None without an image bank."""
        return self._offsets(self.image_bank, emb)

    def _offsets(self, bank: Tensor | None, emb: Tensor) -> Tensor | None:
        return None if bank is None else bank_offsets(bank.to(emb.device), emb, self.beta).to(emb.dtype)

    # --- files ---------------------------------------------------------------------------------
    @classmethod
    def fit(cls, beta: float, rank: int = 128, weights_sha256: str | None = None, **banks) -> Calibration:
        """From full banks ``text=(m, d)`` / ``image=(m, d)`` (each with ``{side}_source=...``): compressed
        as they will be stored, so the object scores exactly as the loaded files will. ``weights_sha256``:
        the weights whose embeddings the banks are (a model's save records its own)."""
        kept, sources, stored = {}, {}, {}
        for side in SIDES:
            bank = banks.get(side)
            if bank is None:
                continue
            stored[side] = compress(bank, rank)
            kept[side] = expand(stored[side])
            sources[side] = {"rows": int(bank.shape[0]), "rank": int(stored[side]["basis"].shape[0]),
                             "source": banks.get(f"{side}_source", "")}
        return cls(beta, kept.get("text"), kept.get("image"), sources, stored, weights_sha256)

    def save(self, directory, weights_sha256: str | None = None) -> None:
        """Write calibration.safetensors and calibration.json into ``directory`` (each atomically), bound to
        ``weights_sha256`` (default: the weights it was fitted for)."""
        directory = Path(directory)
        bound = weights_sha256 or self.weights_sha256
        tensors = {}
        for side, bank in (("text", self.text_bank), ("image", self.image_bank)):
            if bank is not None:
                parts = self.stored.get(side) or compress(bank, self.sources.get(side, {}).get("rank") or min(bank.shape))
                tensors.update({f"{side}_{k}": v.contiguous() for k, v in parts.items()})
        data = safetensors_bytes(tensors)
        write_bytes(directory / FILE, data)
        write_json(directory / RECORD, {"method": METHOD, "beta": self.beta, "banks": self.sources,
                                        "sha256": hashlib.sha256(data).hexdigest(),
                                        **({"weights_sha256": bound} if bound else {})})


def load_calibration(directory, dim: int, weights_sha256: str | None = None, bound: bool = False) -> Calibration | None:
    """The calibration kept in a checkpoint folder (None when it has none), hash-checked; its banks
    must be ``dim``-wide (the model's embedding). ``weights_sha256``: the weights it is loaded for; a
    record naming other weights is refused, and so is one naming none where ``bound`` (a checkpoint saved
    since calibrations record their weights)."""
    directory = Path(directory)
    rec_path, path = directory / RECORD, directory / FILE
    if not rec_path.is_file() and not path.is_file():
        return None
    rec = read_json(rec_path, f"not found (but {FILE} is: the two files belong together)")
    if not isinstance(rec, dict) or not isinstance(rec.get("beta"), (int, float)) or not rec.get("sha256"):
        raise DataError(rec_path, "expected an object with 'beta', 'banks' and 'sha256'")
    if rec.get("method", METHOD) not in METHODS:
        raise DataError(rec_path, f"method {rec['method']!r} is not one this vlmatch computes ({METHOD!r})")
    check_binding(rec, rec_path, weights_sha256, bound)
    verify_sha256(path, rec["sha256"], rec_path)
    tensors = load_file(str(path))
    banks, stored = {}, {}
    for side in SIDES:
        parts = {k: tensors.get(f"{side}_{k}") for k in ("coef", "scale", "basis")}
        if all(v is None for v in parts.values()):
            continue
        if any(v is None for v in parts.values()):
            raise DataError(path, f"the {side} bank needs {side}_coef, {side}_scale and {side}_basis")
        c, s, b = parts["coef"], parts["scale"], parts["basis"]
        if c.dim() != 2 or b.dim() != 2 or s.shape != (c.shape[0],) or c.shape[1] != b.shape[0]:
            raise DataError(path, f"the {side} bank's shapes do not fit together (coef {tuple(c.shape)}, scale "
                                  f"{tuple(s.shape)}, basis {tuple(b.shape)})")
        if b.shape[1] != dim:
            raise DataError(path, f"the {side} bank is {b.shape[1]}-d, but the model embeds in {dim} dimensions: "
                                  "it belongs to another model")
        banks[side], stored[side] = expand(parts), parts
    if not banks:
        raise DataError(path, "holds no bank (text_coef ... or image_coef ...)")
    try:
        return Calibration(float(rec["beta"]), banks.get("text"), banks.get("image"), rec.get("banks") or {},
                           stored, rec.get("weights_sha256"))
    except ConfigError as e:
        raise DataError(rec_path, str(e)) from None


def bind_calibration(directory, weights_sha256: str, fitted_for: str | None = None) -> None:
    """Record in ``directory``'s calibration.json that it belongs to the weights ``weights_sha256``: for
    weights derived from those it was fitted for (``fitted_for``: a record naming other weights is refused),
    such as their float16 copy that ships, or a record written before calibrations named their weights."""
    rec_path = Path(directory) / RECORD
    rec = read_json(rec_path)
    if not isinstance(rec, dict):
        raise DataError(rec_path, "expected an object with 'beta', 'banks' and 'sha256'")
    if fitted_for is not None:
        check_binding(rec, rec_path, fitted_for, bound=False)
    write_json(rec_path, {**rec, "weights_sha256": weights_sha256})


def check_binding(rec: dict, rec_path: Path, weights_sha256: str | None, bound: bool) -> None:
    """Refuse, in one line, a calibration record fitted for other weights than ``weights_sha256``."""
    if weights_sha256 is None:
        return
    own = rec.get("weights_sha256")
    if own is None and bound:
        raise DataError(rec_path, "records no weights_sha256 (the weights it was fitted for), but its checkpoint was "
                                  "saved since calibrations record them: it does not belong to these weights; "
                                  "restore the checkpoint's own calibration or fit it again")
    if own is not None and own != weights_sha256:
        raise DataError(rec_path, f"fitted for other weights ({str(own)[:12]}...) than this checkpoint's "
                                  f"({weights_sha256[:12]}...): it belongs to another model; restore the "
                                  "checkpoint's own calibration or fit it again")


def attach_calibration(model, directory, weights_sha256: str | None = None, bound: bool = False) -> None:
    """Set ``model.calibration`` from the checkpoint folder ``directory`` (left None when it keeps none);
    refused for a model whose scores cannot take one, or fitted for other weights (see
    :func:`load_calibration`)."""
    kept = any((Path(directory) / f).is_file() for f in (RECORD, FILE))
    cal = load_calibration(directory, model.cfg.embed_dim, weights_sha256, bound) if model.calibrates else None
    if kept and not model.calibrates:
        raise DataError(Path(directory) / RECORD, f"model {model.name} takes no calibration (only global-vector "
                                                  "models, whose calibrated score is one inner product)")
    model.calibration = cal
    # checked against the weights this model was loaded with: it travels with them (a copy of the model saved
    # in another dtype binds it to the copy's weights: MatchingModel.save)
    model.__dict__["_loaded_calibration"] = cal
