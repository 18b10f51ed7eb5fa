"""Open-vocabulary search: the ranker's score fused with the zero-shot concept score, in one inner product.

A photo's stage-1 vector ends in its concept vector (:mod:`vlmatch.models.concepts`), a query's in its sentence
vector times ``lam(q) = (w0 + slope * rare(q)) * ratio``, so stage 1 ranks by ``s(q, I) + lam(q) * c(q, I)`` exactly
on every backend; ``dims`` projects both on the leading principal directions of the concept names' vectors, and an
index pins what its concept columns depend on (:meth:`OpenVocab.pins`, :func:`check_pins`). The fusion, the pins and
the measurements: docs/open-vocabulary.md.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from importlib import resources

import numpy as np
import torch

from ..errors import ConfigError

_WORD = re.compile(r"[a-z]+")
STOP = frozenset("a an the and or of in on at to with by for from into onto over under near is are was were be being "
                 "his her their its this that these those some one two three four five several many other while as "
                 "up down out off through front behind next top each another who which it he she they them".split())


def content_words(text: str) -> list[str]:
    """A text's words that carry content: lower case, letters only, function words dropped."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP]


def rare_share(text: str, vocab: frozenset[str] | None) -> float:
    """The share of ``text``'s content words that ``vocab`` (a ranker's training words) does not hold."""
    if not vocab:
        return 0.0
    ws = content_words(text)
    return sum(w not in vocab for w in ws) / len(ws) if ws else 0.0


def training_words(name: str) -> frozenset[str]:
    """The words of a shipped model's training captions (``vlmatch/pretrained/words/NAME.txt``, one per line)."""
    try:
        text = resources.files("vlmatch.pretrained").joinpath("words", f"{name}.txt").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no word list {name!r} ships with vlmatch") from None
    return frozenset(text.split())


@dataclass
class Fusion:
    """How the two scores are fused (an index's manifest records it; the shipped default's is the protocol's
    choice). ``words``: the name of the ranker's training word list, None for no rare-word term."""

    w0: float
    slope: float = 0.0
    ratio: float = 1.0
    words: str | None = None
    concepts: dict = field(default_factory=dict)  # ConceptOptions fields
    relevance: dict = field(default_factory=dict)  # {"a", "b", "threshold"}: see Relevance
    and_beta: float = 0.0  # the AND re-scoring of queries that name several things (vlmatch.search.compose)
    text: str = "base"  # the sentence space: "base" (the packaged MiniLM as trained) or "ranker" (the ranker's own)
    dims: int | None = None  # the concept columns: the leading principal directions of the names (None: all)

    def describe(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, record: dict) -> Fusion:
        try:
            return cls(float(record["w0"]), float(record.get("slope", 0.0)), float(record.get("ratio", 1.0)),
                       record.get("words"), dict(record.get("concepts") or {}), dict(record.get("relevance") or {}),
                       float(record.get("and_beta", 0.0)), str(record.get("text", "base")),
                       None if record.get("dims") is None else int(record["dims"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"open-vocabulary record unreadable ({e}): {record!r}") from None

    def __post_init__(self):
        if self.text not in ("base", "ranker"):
            raise ConfigError(f"open-vocabulary text space must be 'base' or 'ranker', not {self.text!r}")
        if self.dims is not None and self.dims < 1:
            raise ConfigError(f"open-vocabulary dims must be a positive number of columns, not {self.dims}")


@dataclass(frozen=True)
class Relevance:
    """The probability that a person calls the photo a match: an increasing map of the fused score (``scores`` ->
    ``probabilities`` knots, interpolated; experiments/relevance_fit.py); under ``threshold`` the best photo is
    unlikely to match ("no photo matches this well")."""

    scores: tuple[float, ...]
    probabilities: tuple[float, ...]
    threshold: float

    def __call__(self, scores):
        return np.interp(np.asarray(scores, dtype=np.float64), self.scores, self.probabilities)

    @classmethod
    def of(cls, record: dict | None) -> Relevance | None:
        if not record:
            return None
        try:
            xs, ps = tuple(float(v) for v in record["scores"]), tuple(float(v) for v in record["probabilities"])
            rel = cls(xs, ps, float(record["threshold"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"relevance record unreadable ({e})") from None
        if len(xs) != len(ps) or len(xs) < 2 or list(xs) != sorted(xs) or list(ps) != sorted(ps):
            raise ConfigError("relevance record: its knots must be two increasing lists of the same length")
        return rel


NO_MATCH = "no photo matches this well"


def no_match_line(hits) -> str | None:
    """The one line a search says when its best photo is unlikely to match (None when it is likely, or when the
    index has no relevance scale)."""
    if not hits:
        return None
    first = hits[0] if isinstance(hits[0], dict) else vars(hits[0])
    if first.get("relevance") is None or not first.get("no_match"):
        return None
    return f"{NO_MATCH} (best relevance {first['relevance']:.2f}); closest: {first['path']}"


class OpenVocab:
    """The open-vocabulary part of an index: photo concept vectors at build, weighted query vectors at search."""

    def __init__(self, backbone_name: str, fusion: Fusion):
        self.backbone_name = backbone_name
        self.fusion = fusion
        self._ranker = None
        self._vocab = training_words(fusion.words) if fusion.words else None
        self.relevance = Relevance.of(fusion.relevance)

    @property
    def dim(self) -> int:
        """The concept columns: the projection's, else the sentence space's (384, MiniLM's, until it is loaded)."""
        return self.fusion.dims or (self.embedder.dim if "embedder" in self.__dict__ else 384)

    def bind(self, ranker) -> None:
        """The ranker whose text encoder a ``text: ranker`` fusion embeds with (Stage1Source binds its net)."""
        self._ranker = ranker

    @cached_property
    def embedder(self):
        from ..encoders.hf import HFTextEncoder
        from ..encoders.sentence import SentenceEmbedder

        if self.fusion.text != "ranker":
            return SentenceEmbedder()
        hf = next((m for m in (self._ranker.modules() if self._ranker is not None else ())
                   if isinstance(m, HFTextEncoder)), None)
        if hf is None:
            raise ConfigError("this open-vocabulary fusion embeds with the ranker's transformer text encoder; "
                              "the model has none")
        return SentenceEmbedder(encoder=hf)

    @cached_property
    def scorer(self):
        from ..features.concepts import imagenet_head
        from ..models.concepts import ConceptOptions, ConceptScorer

        w, b = imagenet_head(self.backbone_name)
        return ConceptScorer(w, b, self.embedder, ConceptOptions(**self.fusion.concepts))

    @cached_property
    def basis(self) -> torch.Tensor | None:
        """(H, dims) the leading principal directions of the concept names' vectors (None: no projection)."""
        if self.fusion.dims is None:
            return None
        from ..models.concepts import principal_directions

        return principal_directions(self.scorer.name_vectors(), self.fusion.dims)

    def project(self, vectors: torch.Tensor) -> torch.Tensor:
        basis = self.basis
        return vectors if basis is None else vectors.float() @ basis

    def photo_vectors(self, grids: torch.Tensor) -> torch.Tensor:
        return self.project(self.scorer.photo_vectors(grids.float()))

    def text_vectors(self, texts: list[str]) -> torch.Tensor:
        """(n, dim) the texts' sentence vectors in the concept columns' space (projected where the fusion is)."""
        return self.project(self.embedder.embed(texts))

    def weights(self, texts: list[str]) -> torch.Tensor:
        f = self.fusion
        return torch.tensor([(f.w0 + f.slope * rare_share(t, self._vocab)) * f.ratio for t in texts])

    def query_vectors(self, texts: list[str]) -> torch.Tensor:
        """(n, dim) query sentence vectors times each query's weight."""
        return self.text_vectors(texts) * self.weights(texts)[:, None]

    def pins(self) -> dict:
        """What the concept columns depend on beyond the fusion's fields, as this process computes them (lexicon
        digest, sentence encoder hash, concept options, the basis's :func:`basis_probe`): an index records them."""
        from ..features.concepts import load_lexicon
        from ..models.concepts import ConceptOptions

        out = {"lexicon": load_lexicon().digest, "text": self.embedder.content_hash(),
               "concepts": ConceptOptions(**self.fusion.concepts).describe()}
        if self.fusion.dims is not None:
            out["basis"] = basis_probe(self.basis)
        return out

    def mismatch(self, recorded: dict | None) -> str | None:
        """What differs between an index's recorded pins and this process's (a few words), None when they agree."""
        if not recorded:
            return "it records none of what its concept columns depend on (built before vlmatch pinned them)"
        now = self.pins()
        for key, what in (("lexicon", "concept lexicon"), ("text", "sentence encoder")):
            if recorded.get(key) != now[key]:
                return f"its {what} was {str(recorded.get(key))[:16]}, this vlmatch's is {now[key][:16]}"
        if recorded.get("concepts") != now["concepts"]:
            changed = sorted(k for k in now["concepts"] if (recorded.get("concepts") or {}).get(k) != now["concepts"][k])
            return f"its concept options differ ({', '.join(changed)})"
        if "basis" in now:
            old = recorded.get("basis")
            if not isinstance(old, list) or len(old) != len(now["basis"]):
                return "it records no projection basis of this width"
            if max(abs(a - b) for a, b in zip(old, now["basis"], strict=True)) > BASIS_TOLERANCE:
                return "its projection basis differs from the one this vlmatch computes"
        return None

    def describe(self) -> dict:
        return {"backbone": self.backbone_name, **self.fusion.describe(), "dim": self.dim, "pins": self.pins()}

    @classmethod
    def for_model(cls, checkpoint, backbone: dict | None, want: bool | None = None, *,
                  weights_sha256: str | None = None) -> OpenVocab | None:
        """The part a new index of ``checkpoint`` (or of the model with ``weights_sha256``) gets, or None. ``want``
        None: where the model ships with a fusion record and an EfficientNet-Lite backbone; True: required; False:
        never."""
        from ..pretrained import open_vocab_record

        if want is False:
            return None
        record = open_vocab_record(checkpoint, weights_sha256=weights_sha256)
        name = (backbone or {}).get("name") or ""
        if record is None or not name.startswith("efficientnet-lite"):
            if want:
                why = (f"{checkpoint} records no fusion (a shipped model's registry entry holds one: the default's)"
                       if record is None else f"its backbone {name or 'is unknown'} has no ImageNet head vlmatch reads")
                raise ConfigError(f"--open-vocab: {why}")
            return None
        return cls(name, Fusion.of(record))

    @classmethod
    def from_manifest(cls, manifest: dict) -> OpenVocab | None:
        """The part an index was built with (its manifest's record), or None."""
        rec = manifest.get("open_vocab")
        if not rec:
            return None
        return cls(rec.get("backbone") or (manifest.get("backbone") or {}).get("name", ""), Fusion.of(rec))

    @classmethod
    def for_update(cls, manifest: dict, concepts: bool = False) -> tuple[OpenVocab | None, bool]:
        """(the part an update encodes with, whether every photo is encoded again for it): an index keeps its part
        (``concepts``: encoded again), one built --no-open-vocab stays without, and one built before the part existed
        gets it where its model ships with a fusion."""
        if manifest.get("open_vocab"):
            return cls.from_manifest(manifest), concepts
        if "open_vocab" in manifest:
            if concepts:
                raise ConfigError("--concepts: this index was built without the open-vocabulary part "
                                  "(--no-open-vocab); it has no concept columns to encode")
            return None, False
        part = cls.for_model(None, manifest.get("backbone"),
                             weights_sha256=(manifest.get("retriever") or manifest["model"]).get("sha256"))
        return part, part is not None


# the basis is computed again in each process: for the shipped default (128 of 384 columns, keeping the score at a
# correlation of 0.998 on Flickr8k val; the 128th and 129th singular values 0.5 % apart) name vectors perturbed by
# 1e-5 move it by at most 0.0012 per entry, the probe's entries by a few thousandths; another lexicon, text model or
# template moves them by about their own size (0.05)
BASIS_TOLERANCE = 0.01


def basis_probe(basis: torch.Tensor) -> list[float]:
    """A basis's fingerprint that survives float noise between hosts: its (dims,) coordinates of a fixed unit
    vector (seeded), rounded to 6 decimals; compared entry by entry within :data:`BASIS_TOLERANCE`."""
    g = torch.Generator().manual_seed(0)
    probe = torch.randn(basis.shape[0], generator=g, dtype=torch.float64)
    return [round(float(v), 6) for v in basis.double().T @ (probe / probe.norm())]


def check_pins(open_vocab: OpenVocab | None, manifest: dict, where) -> None:
    """Refuse, in one line naming the fix, an index (``manifest`` of ``where``) whose concept columns were made
    otherwise than this process would make its queries'."""
    why = None if open_vocab is None else open_vocab.mismatch((manifest.get("open_vocab") or {}).get("pins"))
    if why is None:
        return
    if hasattr(where, "uri") and hasattr(where, "collection"):  # a Milvus index: its vector field is written once
        fix = (f"build it again (`vlmatch index build --backend milvus --milvus-uri {where.uri} --collection "
               f"{where.collection} --images DIR`)")
    else:
        fix = f"run `vlmatch index update {where} --concepts` to encode them again"
    raise ConfigError(f"{where}: its photos' concept columns do not match this vlmatch's queries ({why}): {fix}")
