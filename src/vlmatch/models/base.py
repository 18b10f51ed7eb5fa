"""The model protocol shared by every matching model.

Every model splits into a pair-independent part (``encode_images``, ``encode_texts``: run once
per image / caption) and a pair-dependent part (``score``: a whole block of pairs at once).
Training scores the B x B batch with ``score``; evaluation fills the full matrix block by block
with the same ``score`` (see :mod:`vlmatch.evaluation.scoring`). One code path for both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, VlmatchError
from ..options import check_mapping, dataclass_specs, raise_problems

EPS = 1e-8


def l2norm(x: Tensor, dim: int = -1, eps: float = EPS, floor: bool = False) -> Tensor:
    """x as unit vectors along ``dim``: x / (||x|| + eps), SCAN's definition (every model's); with ``floor``,
    x / max(||x||, eps), the form of SMAN's cosines (a·b / max(||a|| ||b||, eps)), so its unit vectors give
    exactly the cosines its score computes. The one unit-normalisation of the models."""
    if not floor and x.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return _Unit.apply(x, dim, eps)  # (under torch.compile, Inductor fuses the plain chain itself)
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    return x / (norm.clamp(min=eps) if floor else norm + eps)


class _Unit(torch.autograd.Function):
    """x / (||x|| + eps) along ``dim`` with its gradient in one expression, g / d - x (Σ g x) / (d² ||x||) with
    d = ||x|| + eps: about half the passes over x of autograd's chain (division, broadcast sum, norm), which
    matters where the normalised tensors are per pair (CAAN's (pairs x regions x words) responses). Equal to
    autograd's gradient to float rounding, also at x = 0 (only g / eps remains), tested in float64."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, eps: float) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
        d = norm + eps
        ctx.save_for_backward(x, norm, d)
        ctx.dim, ctx.eps = dim, eps
        return x / d

    @staticmethod
    def backward(ctx, g: Tensor):
        x, norm, d = ctx.saved_tensors
        if torch.is_grad_enabled():  # a gradient that is differentiated again (create_graph): autograd's own
            return differentiable_backward(lambda v: v / (_norm_zero_safe(v, ctx.dim) + ctx.eps), (x,), g) + (None, None)
        coef = ((g * x).sum(ctx.dim, keepdim=True) / (d * d)).div_(norm.clamp(min=torch.finfo(norm.dtype).tiny))
        return (g / d).sub_(x * coef), None, None


def _norm_zero_safe(x: Tensor, dim: int) -> Tensor:
    """||x|| along ``dim`` whose derivatives of every order are finite at x = 0 (taken as 0 there, a
    subgradient): a zero vector (CAAN's rectified responses of a region no word reaches) must not make the
    second derivative NaN, as the square root's would."""
    sq = (x * x).sum(dim, keepdim=True)
    some = sq > 0
    return torch.where(some, torch.where(some, sq, torch.ones_like(sq)).sqrt(), torch.zeros_like(sq))


def differentiable_backward(forward, inputs: tuple[Tensor, ...], g: Tensor) -> tuple[Tensor, ...]:
    """The vector-Jacobian product of ``forward(*inputs)`` with ``g``, built by autograd with its own graph: the
    backward a hand-written ``autograd.Function`` falls back to when its gradient is differentiated again
    (double backward, e.g. a loss on gradient x input maps), where its fused in-place backward would not be."""
    with torch.enable_grad():
        ins = tuple(t if t.requires_grad else t.detach().requires_grad_(True) for t in inputs)
        return torch.autograd.grad(forward(*ins), ins, g, create_graph=True)


def safe_sqrt(x: Tensor) -> Tensor:
    """sqrt with a finite gradient at 0 (the argument is floored at EPS², far below any tolerance)."""
    return x.clamp(min=EPS * EPS).sqrt()


def length_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Bool (B, L) mask of valid positions for padded sequences."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def masked_mean(x: Tensor, mask: Tensor | None, dim: int) -> Tensor:
    """Mean of ``x`` over ``dim`` counting only positions where ``mask`` (broadcastable) is true."""
    if mask is None:
        return x.mean(dim=dim)
    m = mask.to(x.dtype)
    return (x * m).sum(dim=dim) / m.sum(dim=dim).clamp(min=1)


@dataclass
class Encoding:
    """A batch of encoded items; every tensor field has the batch on axis 0."""

    # Fields an index stores in float32 even when its store is float16: those whose rounding the
    # score amplifies (measured per model in benchmarks/search.py and tests/search/test_store.py).
    full_precision_fields: ClassVar[tuple[str, ...]] = ()

    def tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __len__(self) -> int:
        return len(next(iter(self.tensors().values())))

    def select(self, index) -> Encoding:
        """Rows ``index`` (a slice, an index tensor or a list) of every field."""
        return dataclasses.replace(self, **{k: v[index] for k, v in self.tensors().items()})

    def map(self, fn) -> Encoding:
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()})

    def to(self, device) -> Encoding:
        return self.map(lambda t: t.to(device))

    def detach(self) -> Encoding:
        return self.map(lambda t: t.detach())

    @classmethod
    def cat(cls, parts: list[Encoding]) -> Encoding:
        """Concatenate batches; fields whose axis 1 differs (e.g. words) are zero-padded."""
        out = {}
        for name, first in parts[0].tensors().items():
            ts = [getattr(p, name) for p in parts]
            if first.dim() >= 2:
                size = max(t.shape[1] for t in ts)
                ts = [F.pad(t, (0, 0) * (t.dim() - 2) + (0, size - t.shape[1])) if t.shape[1] < size else t for t in ts]
            out[name] = torch.cat(ts, dim=0)
        return dataclasses.replace(parts[0], **out)


@dataclass
class ImageEncoding(Encoding):
    regions: Tensor | None = None  # (B, k, D) projected region vectors
    mask: Tensor | None = None  # (B, k) bool, valid regions
    embedding: Tensor | None = None  # (B, D) a global vector
    offset: Tensor | None = None  # (B,) a calibrated model's c(I), subtracted from every score (models.calibration)


@dataclass
class TextEncoding(Encoding):
    lengths: Tensor | None = None  # (B,) number of valid words
    words: Tensor | None = None  # (B, L, D) word vectors
    embedding: Tensor | None = None  # (B, D) a global vector
    offset: Tensor | None = None  # (B,) a calibrated model's d(T), subtracted from every score (models.calibration)

    # Fields with one row per word on axis 1; subclasses with per-word extras extend this.
    per_word_fields: ClassVar[tuple[str, ...]] = ("words",)

    def trim(self) -> TextEncoding:
        """Drop padding columns beyond the longest caption in this block."""
        if self.words is None:
            return self
        n = int(self.lengths.max())
        cut = {f: getattr(self, f)[:, :n] for f in self.per_word_fields if getattr(self, f) is not None}
        return dataclasses.replace(self, **cut)


@dataclass(frozen=True)
class Selection:
    """What the best checkpoint is chosen by: ``"recall"``, the recalls (rsum) of the model's full val score
    matrix, or ``"reranked"``, the recalls after MTFN-RR re-ranking with the model's own S_TT
    (``caption_scores``) with ``k`` candidates and ``k_text`` caption neighbours."""

    kind: Literal["recall", "reranked"] = "recall"
    k: int | None = None
    k_text: int | None = None


@dataclass
class ModelConfig:
    """Common sizes every model accepts under these names."""

    img_dim: int = 2048
    embed_dim: int = 1024
    word_dim: int = 300
    vocab_size: int = 10000


def _checking_img_dim(encode_images):
    """Wrap a model's ``encode_images`` with a check of the features' last dimension against img_dim."""

    @functools.wraps(encode_images)
    def checked(self, features, *args, **kwargs):
        dim, shape = getattr(self.cfg, "img_dim", None), getattr(features, "shape", None)
        if self.checks_img_dim and dim is not None and shape is not None and len(shape) and shape[-1] != dim:
            raise ConfigError(f"features of shape {tuple(shape)} have {shape[-1]} values per region, but model "
                              f"{self.name} was created with img_dim={dim}: create it with img_dim={shape[-1]} "
                              f"(the features' last dimension)")
        return encode_images(self, features, *args, **kwargs)

    return checked


class MatchingModel(nn.Module):
    """Base class: subclasses set ``Config`` and implement the three protocol methods (``encode_images``,
    ``encode_texts``, ``score``). The trainer, the engine, ``explain`` and search call only the methods below,
    each with a default a model may override, never ``if model.name == ...``."""

    Config: ClassVar[type] = ModelConfig
    uses_vocab: ClassVar[bool] = True  # the trainer builds a word vocabulary and sets vocab_size
    # encode_images checks that features end in cfg.img_dim values (one clear error instead of a bare
    # "mat1 and mat2 shapes cannot be multiplied"); a model whose input is not (..., img_dim) sets False
    checks_img_dim: ClassVar[bool] = True
    # Options a checkpoint's config.json may lack because they were added, or their default changed, after
    # it was written: the value such a checkpoint was trained and scored with. ``load_model`` fills a
    # missing key from here, never from today's default, so an old checkpoint scores exactly as before.
    legacy_options: ClassVar[dict[str, Any]] = {}
    # whether the model takes a query-bank calibration (vlmatch.models.calibration): global-vector models,
    # whose offsets are per item and whose calibrated score is again one inner product
    calibrates: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "encode_images" in cls.__dict__:
            cls.encode_images = _checking_img_dim(cls.__dict__["encode_images"])

    @classmethod
    def needs_vocab(cls, options: dict) -> bool:
        """Whether a model built with ``options`` tokenises with a word vocabulary built from the training
        captions (asked by the trainer before the model exists)."""
        return cls.uses_vocab

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.cfg = config
        self.name: str = type(self).__name__.lower()
        self.vocab = None  # a vlmatch.data.vocab.Vocab once attached (saved with the model)
        # a vlmatch.models.calibration.Calibration once attached (saved with the model; None while training)
        self.calibration = None

    # --- protocol -------------------------------------------------------------------------
    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> ImageEncoding:
        raise NotImplementedError

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> TextEncoding:
        raise NotImplementedError

    def score(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        raise NotImplementedError

    def forward(self, features, mask, tokens, lengths) -> Tensor:
        return self.score(self.shared("encode_images", self.encode_images, features, mask),
                          self.shared("encode_texts", self.encode_texts, tokens, lengths))

    @contextlib.contextmanager
    def evaluating(self):
        """Within this block the model is in eval mode; after it, in the mode it was in before."""
        was_training = self.training
        self.eval()
        try:
            yield self
        finally:
            self.train(was_training)

    # --- one encoder pass per training step -----------------------------------------------
    @contextlib.contextmanager
    def shared_encodings(self):
        """Within this block, a :meth:`shared` call with the very same input tensors (the same objects) as an
        earlier one returns the earlier output and its graph: the training step's matching pass and its
        grounding objective run the encoders (a transformer, a per-cell head) once, not twice. Outside it
        nothing is kept, so a later step never meets a graph that backward has already freed."""
        self.__dict__["_shared_memo"] = {}
        try:
            yield self
        finally:
            self.__dict__.pop("_shared_memo", None)

    def shared(self, name: str, fn, *args):
        """``fn(*args)``, or inside :meth:`shared_encodings` the output of an earlier call with the same ``name``
        and the same argument objects."""
        memo = self.__dict__.get("_shared_memo")
        if memo is None:
            return fn(*args)
        hit = memo.get(name)
        if hit is not None and len(hit[0]) == len(args) and all(a is b for a, b in zip(hit[0], args, strict=True)):
            return hit[1]
        out = fn(*args)
        memo[name] = (args, out)
        return out

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int] | None:
        """The unavoidable work of ``score`` per (image, caption) pair, counted from the model's
        equations (not from what its code happens to do): ``{"macs": multiply-adds, "transcendentals":
        exp / tanh / sigmoid / sqrt / log evaluations}``. Pair-independent work (``encode_*``) is not
        counted. The scoring benchmark's roofline divides it by the machine's measured peaks;
        None means the model has not declared it."""
        return None

    def batch_score_flops(self, batch: int, n_regions: int, n_words: int) -> dict[str, int] | None:
        """The unavoidable work of ``score`` on a training batch (``batch`` images x ``batch`` captions), in
        the form training must compute it, same keys as ``pair_flops``. Default: batch² x ``pair_flops``.
        A model whose inference count relies on a folding that training cannot use (MTFN's rank
        fusion) says what a differentiable step has to do instead; the training roofline reads this."""
        pair = self.pair_flops(n_regions, n_words)
        return None if pair is None else {k: batch * batch * v for k, v in pair.items()}

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        """Working memory ``score`` needs per (image, caption) pair; sizes the engine's blocks."""
        return 64

    # --- extension points ------------------------------------------------------------------
    def tokenize(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        """Caption strings -> (tokens (B, L) long, padded with 0; lengths (B,)), ready for ``encode_texts``."""
        if self.vocab is None:
            raise ConfigError(f"model {self.name} has no vocabulary attached: build one from the training captions "
                              "(vlmatch.data.vocab.Vocab.build) and set model.vocab, or load a checkpoint")
        from ..data.loaders import pad_tokens

        return pad_tokens([self.vocab.encode(c) for c in captions])

    def decode_tokens(self, tokens: Tensor, length: int) -> list[str]:
        """The words (or word pieces) of one tokenised caption, for labelling attention maps."""
        if self.vocab is None:
            return [str(int(t)) for t in tokens[:length]]
        return self.vocab.decode(tokens[:length].tolist())

    def prepare_captions(self, token_lists: list[list[int]], progress: bool = False) -> None:
        """Called by the trainer with every tokenised caption of a split before it trains or validates on
        it: a model with a frozen, cached text encoder encodes the captions not cached yet, in large
        batches, so each training step reads its text from one table. Default: nothing."""

    def loss(self, scores: Tensor, batch: dict, train_cfg: dict, hardest: bool) -> Tensor:
        """Training objective from the batch score matrix (default: hinge triplet, both directions).

        ``batch`` is the collated batch (``image_index`` marks captions of the same image);
        ``hardest`` says whether the schedule is past its warm-up (hardest negatives only).
        """
        from .losses import hinge_triplet

        return hinge_triplet(scores, train_cfg["margin"], hardest, batch["image_index"].to(scores.device))

    def begin_stage(self, stage: str | None) -> str:
        """Enter training stage ``stage`` (the config's ``train.stage``; None = the model's only / first
        stage) and return the batch kind it trains on (a key of ``vlmatch.data.loaders.BATCH_KINDS``).
        A multi-stage model (MTFN's text-text stage) freezes, initialises and switches here."""
        if stage not in (None, "image_text"):
            raise ConfigError(f"model {self.name} has no training stage {stage!r}")
        return "image_caption"

    def checkpoint_selection(self) -> Selection:
        """How the trainer chooses this model's best checkpoint on the validation split, declared as data
        (run by :mod:`vlmatch.evaluation.validate`); default: the recalls of the full score matrix."""
        return Selection()

    def has_text_similarity(self) -> bool:
        """Whether ``caption_scores`` gives a trained caption-caption similarity."""
        return False

    def caption_scores(self, a: TextEncoding, b: TextEncoding) -> Tensor:
        """A learned caption-caption similarity S_TT (rows ``a``, columns ``b``), for T2I re-ranking."""
        raise VlmatchError(f"model {self.name} has no text-text similarity")

    def global_embeddings(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor] | None:
        """Per-item vectors (images (B, d), captions (B', d)) whose inner product is this model's
        pair-independent (stage-1) score; None when the model has no such part."""
        return None

    def score_is_global(self) -> bool:
        """Whether ``score`` is exactly the inner product of the vectors ``global_embeddings`` returns (VSE++,
        calibrated or not; MMCA with alpha 0). A search whose stage 1 holds this model's own vectors then has its
        final scores from stage 1 (exact float32 inner products of the candidates) and skips stage 2."""
        return False

    def pair_attention(self, img: ImageEncoding, txt: TextEncoding) -> dict:
        """Attention of ONE pair (``img`` and ``txt`` hold one item each) for heat maps:
        ``{"weights": (k, n) float array, "axis": "regions" | "words" | "pair"}`` where "regions" means
        each word's weights over the k image positions sum to 1 (a column), "words" each region's over
        the n words (a row), "pair" the weight of each (region, word) term in the score (the matrix
        sums to 1; CAAN's f_i g_j). Extra keys carry model-specific vectors. Models without
        word-region attention raise."""
        raise VlmatchError(f"model {self.name} has no word-region attention to show")

    def position_contributions(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """The exact share of every (image position, word) term in the score of the pairs (image b, caption b),
        for models whose score decomposes over positions: (B, k, L) with ``out[b].sum() == score(b, b)``
        (padded words and masked positions are 0). ``features`` (B, k, img_dim) are the raw region features
        (a model may pool them, so the share is taken before), ``tokens``/``lengths`` the B captions (the
        per-word vectors are made here: encodings kept for search hold only what ``score`` needs).
        Differentiable (the grounding loss trains through it). Models whose score does not decompose raise."""
        raise VlmatchError(f"model {self.name} has no exact decomposition of its score over image positions "
                           f"(use the gradient or occlusion explanation)")

    def position_attention(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """The attention weights ``pair_attention`` shows, for the pairs (image b, caption b) of a batch: (B, k, L),
        padded words and masked positions 0, on ``pair_attention``'s axis (its weights for one pair equal
        ``out[b, :, :n]``). Differentiable: ``train.grounding_map: attention`` trains the model's own attention
        to point. Models whose heat maps are not per-word attention over image positions raise."""
        raise VlmatchError(f"model {self.name} has no per-word attention over image positions to train "
                           f"(use train.grounding_map: contribution)")

    def save_extra(self, directory: Path) -> None:
        """Write model-owned files beside the weights (e.g. a tokenizer). Default: nothing."""

    def load_extra(self, directory: Path) -> None:
        """Read what ``save_extra`` wrote."""

    # --- persistence --------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config": dataclasses.asdict(self.cfg)}

    def save(self, directory) -> Path:
        """Write ``model.safetensors`` + ``config.json`` (+ ``vocab.json``, the model's own files, its
        calibration) into ``directory``; config.json records the SHA-256 of the weights, and
        ``checksums.json``, written last, every file's (:mod:`vlmatch.checkpoints.seal`; checked by
        ``load_model``). A caller that adds files to the folder afterwards seals it again. The one
        checkpoint writer of :mod:`vlmatch.checkpoints.write`."""
        from ..checkpoints.write import save_model

        return save_model(self, directory)

    def load_weights(self, path, sha256: str | None = None) -> None:
        """Load ``path`` (checked against ``sha256`` when given, and shape by shape before loading): the
        one weights reader of :mod:`vlmatch.checkpoints.read`."""
        from ..checkpoints.read import load_weights_into

        load_weights_into(self, path, sha256)


def check_options(cls: type, overrides: dict, model_name: str) -> dict:
    """Type- and range-check model options against ``cls``'s annotations; returns them normalised."""
    specs = dataclass_specs(cls)
    unknown = set(overrides) - set(specs)
    if unknown:
        raise ConfigError(f"model {model_name!r} has no option(s) {sorted(unknown)}; valid: {sorted(specs)}")
    out, problems = check_mapping(overrides, specs, "model")
    raise_problems(problems)
    return out


def make_config(cls: type, defaults: dict, overrides: dict, model_name: str):
    opts = check_options(cls, {**defaults, **overrides}, model_name)
    try:
        return cls(**opts)
    except (ValueError, TypeError) as e:  # a __post_init__ rule tying options together
        raise ConfigError(f"model {model_name!r}: {e}") from None
