"""What an index build is asked for and what it encodes, whatever the backend that stores it: :func:`prepare` loads
the models, reads the sources and starts the one manifest every backend commits; the backend
(:mod:`vlmatch.search.build`, :mod:`vlmatch.search.backends.milvus.build`) encodes the :class:`Part` s."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..checkpoints.digest import checkpoint_fingerprint
from ..errors import ConfigError, DataError
from ..features.photo import READER_VERSION
from ..models.base import MatchingModel
from ..weights import sha256_file
from .checks import read_captions
from .encode import Batch, Stage1Source, fingerprint, index_models
from .inputs import caption_batches, feature_batches, image_batches, image_row, photo_folder, precomp_features
from .open_vocab import OpenVocab, check_pins
from .scan import file_stat

SCORES = ("model", "mean")  # stage 2's ranking score (see BuildOptions.score)


@dataclass(frozen=True)
class BuildOptions:
    """What an index build reads and how it encodes and stores it (``vlmatch index build``'s flags).

    One source of photos, ``images`` (a folder) or ``features`` (a precomp folder's ``split``), and/or ``captions``.
    ``retriever_ckpt``: the stage-1 model where the model has no global part. ``score``: stage 2 ranks by the
    model's own score (``"model"``) or its mean with the retriever's (``"mean"``). ``open_vocab``: None where the
    model ships with a fusion (:mod:`vlmatch.search.open_vocab`), True required, False never. ``date_from_mtime``:
    a photo without an EXIF capture time is dated by its mtime. ``overwrite``: the folder may hold other files."""

    images: str | Path | None = None
    features: str | Path | None = None
    split: str = "test"
    captions: str | Path | None = None
    retriever_ckpt: str | Path | None = None
    backbone: str | None = None
    weights: str | Path | None = None
    dtype: str = "float16"
    ann: str = "auto"
    nlist: int | None = None
    hnsw_m: int = 32
    score: str = "model"
    open_vocab: bool | None = None
    skip_bad: bool = False
    date_from_mtime: bool = False
    overwrite: bool = False
    batch_size: int = 64
    progress: bool = True

    def check(self) -> BuildOptions:
        """Refuse, in one line, options that cannot make an index."""
        if self.images is None and self.features is None and self.captions is None:
            raise ConfigError("index build needs --images DIR, --features DIR or --captions FILE")
        if self.images is not None and self.features is not None:
            raise ConfigError("index build takes --images or --features, not both")
        if self.score not in SCORES:
            raise ConfigError(f"--score {self.score!r}: expected one of {', '.join(SCORES)}")
        if self.score == "mean" and self.retriever_ckpt is None:
            raise ConfigError("--score mean averages the model's and the retriever's scores: give --retriever too")
        return self


@dataclass(frozen=True)
class UpdateOptions:
    """How an update encodes the new and changed photos of an image-folder index (``vlmatch index update``'s
    flags). ``concepts``: also encode every photo's concept columns again, with this vlmatch's lexicon, text encoder
    and basis (an index whose pins differ is refused until then)."""

    skip_bad: bool = False
    weights: str | Path | None = None
    date_from_mtime: bool = False
    concepts: bool = False
    batch_size: int = 64
    progress: bool = True


def with_settings(cls, given, settings: dict):
    """``given`` (an options value, or None for the defaults) with ``settings`` (keyword arguments) replaced."""
    return replace(given if given is not None else cls(), **settings)


def load_index_model(path) -> tuple[MatchingModel, dict]:
    """The checkpoint an index is built with, and what the manifest records of it."""
    from ..models.registry import load_checkpoint

    path = Path(path)
    if not (path / "model.safetensors").is_file():
        raise DataError(path, "not a checkpoint folder (no model.safetensors)")
    model = load_checkpoint(path)
    # checkpoint_sha256: the whole folder (its checksums.json: weights, calibration, adapters, tokenizer ...),
    # which fingerprints a resumable build; sha256: the weights alone
    return model, {"name": model.name, "checkpoint": str(path.resolve()),
                   "sha256": sha256_file(path / "model.safetensors"), "checkpoint_sha256": checkpoint_fingerprint(path),
                   "config": model.config_dict()["config"]}


def stage1_source(model, retriever, open_vocab=None) -> Stage1Source:
    """Where an index's stage-1 vectors come from (the retriever must read the model's features)."""
    if retriever is not None and retriever.cfg.img_dim != model.cfg.img_dim:
        raise ConfigError(f"retriever {retriever.name} takes {retriever.cfg.img_dim}-d features, the model "
                          f"{model.cfg.img_dim}-d: they must be trained on the same features")
    return Stage1Source(model, retriever, open_vocab)


def image_encoder(model: MatchingModel, source: Stage1Source):
    @torch.no_grad()
    def encode(b: Batch):
        img = model.encode_images(b.features)
        return img, source.image_vectors(b.features, img)
    return encode


def caption_encoder(model: MatchingModel, source: Stage1Source, n_regions: int):
    @torch.no_grad()
    def encode(b: Batch):
        tokens, lengths = model.tokenize(b.captions)
        txt = model.encode_texts(tokens, lengths)
        return txt, source.text_vectors(b.captions, txt, n_regions)
    return encode


def versions() -> dict:
    import faiss

    from ..version import __version__

    return {"vlmatch": __version__, "torch": torch.__version__, "numpy": np.__version__, "faiss": faiss.__version__,
            "python": platform.python_version()}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Part:
    """One collection to encode: its inputs (``keys``), how they are read (``batches(keys, done)``), encoded
    (``encode(batch) -> (encoding, stage-1 vectors)``) and tabled (``row_of(key, id, meta)``), what identifies
    them, and a caption store's word width (``pad_to``)."""

    name: str
    keys: list
    batches: Callable[[list, int], Iterator[Batch]]
    encode: Callable
    row_of: Callable[[object, int, dict], dict]
    what: tuple
    pad_to: int | None = None


@dataclass
class Job:
    """A build ready to encode: its models, stage-1 source, the manifest started and the parts."""

    options: BuildOptions
    model: MatchingModel
    retriever: MatchingModel | None
    source: Stage1Source
    manifest: dict
    parts: list[Part] = field(default_factory=list)

    def fingerprint(self, parts: list[Part], *extra) -> str:
        """What a resumed build of ``parts`` must share with the interrupted one: inputs, models, options."""
        m, o = self.manifest, self.options
        return fingerprint([p.what for p in parts], m["model"]["checkpoint_sha256"],
                           m["retriever"] and m["retriever"]["checkpoint_sha256"], o.dtype, o.score, o.date_from_mtime,
                           m["open_vocab"], *extra)

    def finish(self, collections: dict, skipped: list | None, next_id: int | None) -> dict:
        """The manifest once the backend has written ``collections`` (their manifest entries)."""
        m = self.manifest
        m["collections"] = collections
        m["counts"] = {k: v["count"] for k, v in collections.items()}
        if skipped is not None:
            m["skipped"], m["next_id"] = skipped, next_id
        return m


def prepare(model_ckpt, opts: BuildOptions, *, fmt: int, extra_versions: dict | None = None) -> Job:
    """Load the models, check the sources against them and start the manifest (model, retriever, stage 1, score,
    open-vocabulary part, dtype, backbone, source, dims, versions): the one every backend commits."""
    from ..features.provenance import checkpoint_backbone

    model, model_info = load_index_model(model_ckpt)
    retriever, retriever_info = (None, None) if opts.retriever_ckpt is None else load_index_model(opts.retriever_ckpt)
    # a bad caption file is refused before any encoding
    caption_rows = None if opts.captions is None else read_captions(model, opts.captions, opts.ann, opts.nlist)
    trained = checkpoint_backbone(model_ckpt)
    open_vocab = OpenVocab.for_model(opts.retriever_ckpt or model_ckpt, trained, opts.open_vocab)
    source = stage1_source(model, retriever, open_vocab)
    manifest = {"format": fmt, "created": now(), "reader": READER_VERSION, "model": model_info,
                "retriever": retriever_info, "stage1": source.describe(), "score": opts.score,
                "open_vocab": None if open_vocab is None else open_vocab.describe(), "dtype": opts.dtype,
                "backbone": trained, "source": {}, "collections": {}, "versions": {**versions(), **(extra_versions or {})}}
    job = Job(opts, model, retriever, source, manifest)
    n_regions = None
    encode_images = image_encoder(model, source)
    if opts.images is not None:
        root, rels, bb, n_regions = photo_folder(opts.images, model_ckpt, model, backbone=opts.backbone,
                                                 weights=opts.weights, manifest=manifest)
        if opts.date_from_mtime:
            manifest["source"]["date_from_mtime"] = True
        job.parts.append(Part("images", rels, image_batches(root, bb, batch_size=opts.batch_size, skip_bad=opts.skip_bad,
                                                            date_from_mtime=opts.date_from_mtime),
                              encode_images, lambda rel, i, meta: image_row(root, rel, i, meta),
                              ("images", rels, [file_stat(root, r)["size"] for r in rels], bb.describe())))
    elif opts.features is not None:
        n_regions, names, img_dir, feats = precomp_features(opts.features, opts.split, model, manifest)

        def feature_row(row, i, meta):
            return {"id": i, "path": str(Path(img_dir) / names[row]) if img_dir else names[row], "rel": names[row]}

        job.parts.append(Part("images", list(range(len(feats))), feature_batches(feats, batch_size=opts.batch_size),
                              encode_images, feature_row, ("features", manifest["source"]["root"], opts.split,
                                                           feats.shape)))
    dim = source.check(n_regions or 1)  # before any encoding: a model with no stage-1 part fails here
    manifest["dims"] = {"stage1": dim, "regions": n_regions, "img_dim": model.cfg.img_dim}
    if caption_rows is not None:
        caps, width = caption_rows
        manifest["source"]["captions"] = str(Path(opts.captions).resolve())
        job.parts.append(Part("captions", list(range(len(caps))), caption_batches(caps, batch_size=opts.batch_size),
                              caption_encoder(model, source, n_regions or 1),
                              lambda row, i, meta: {"id": i, "text": caps[row]}, ("captions", caps), pad_to=width))
    return job


def update_encoder(checkpoints: dict, manifest: dict, open_vocab, where, *, pinned: bool = True):
    """(stage-1 source, encode) of an update: the index's own models (``checkpoints``, checked against the manifest)
    with ``open_vocab``, whose concept columns must pair with the kept photos' (``pinned``: refused before any write)."""
    model, retriever = index_models(checkpoints)
    source = stage1_source(model, retriever, open_vocab)
    if pinned:
        check_pins(open_vocab, manifest, where)
    return source, image_encoder(model, source)


def photo_root(manifest: dict, where) -> Path:
    """The photo folder an update of index ``where`` scans again; an index of anything else is refused."""
    kind = (manifest.get("source") or {}).get("kind")
    if kind != "images":
        raise ConfigError(f"{where}: only an index of an image folder can be updated (this one indexes {kind}); "
                          "build it again instead")
    return Path(manifest["source"]["root"])


def update_part(manifest: dict, rels: list[str], encode, opts: UpdateOptions) -> Part:
    """The photos ``rels`` of an index's folder, read with its backbone, as an update encodes them. A build that
    dated photos by their mtime has its updates do the same (its manifest's source records it)."""
    from ..features.backbones import backbone_for

    root = Path(manifest["source"]["root"])
    bb = backbone_for(manifest["backbone"], opts.weights)
    dated = opts.date_from_mtime or bool(manifest["source"].get("date_from_mtime"))
    return Part("images", rels, image_batches(root, bb, batch_size=opts.batch_size, skip_bad=opts.skip_bad,
                                              date_from_mtime=dated),
                encode, lambda rel, i, meta: image_row(root, rel, i, meta), ("update", rels))
