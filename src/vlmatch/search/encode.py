"""Turning inputs into index rows: stage-1 vectors and stage-2 encodings, resumably.

The stage-1 vector comes from ``global_embeddings`` of the model or of a companion retriever, never from an implicit
mean of a cross-attention model's regions; the side not being indexed is a fixed placeholder whose output is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import DataError, VlmatchError
from ..io import read_json, save_npy, write_bytes, write_json
from ..models.base import ImageEncoding, MatchingModel, TextEncoding
from .store import EncodingWriter, allocate_npy, reserve


def template(model: MatchingModel, coll: str, n_regions: int = 0):
    """One encoding of collection ``coll`` ("images" or "captions") as ``model`` makes it: its fields and shapes."""
    with torch.no_grad():
        if coll == "images":
            return model.encode_images(torch.zeros(1, n_regions, model.cfg.img_dim))
        return model.encode_texts(*model.tokenize(["a"]))


def index_models(checkpoints: dict, device="cpu") -> tuple[MatchingModel, MatchingModel | None]:
    """An index's own model and retriever (``checkpoints``: their folders, sealed by the index's manifest)."""
    from ..models.registry import load_model

    model, retriever = (load_model(checkpoints[k], map_location=device, note_unsealed=False).eval()
                        if k in checkpoints else None for k in ("model", "retriever"))
    return model, retriever


def _global(m: MatchingModel, img, txt):
    out = m.global_embeddings(img, txt)
    if out is None:
        raise VlmatchError(f"model {m.name} has no global (stage-1) part: build the index with --retriever CKPT "
                           "(e.g. a VSE++ trained on the same features)")
    return out


@dataclass
class Stage1Source:
    """Where stage-1 vectors come from: the model's own global part, or a companion retriever."""

    model: MatchingModel
    retriever: MatchingModel | None = None
    # the open-vocabulary part (vlmatch.search.open_vocab.OpenVocab): its columns follow the model's in every
    # stage-1 vector, so that one inner product ranks by the fused score
    open_vocab: object | None = None
    # the fixed placeholder side of global_embeddings, encoded once per (net, shape), not per query
    _placeholders: dict = field(default_factory=dict, repr=False, compare=False)

    def _placeholder(self, net: MatchingModel, side: str, n_regions: int = 0):
        key = (id(net), side, n_regions, net.training)
        if key not in self._placeholders:
            self._placeholders[key] = template(net, side, n_regions)
        return self._placeholders[key]

    def __post_init__(self):
        if self.open_vocab is not None and hasattr(self.open_vocab, "bind"):
            self.open_vocab.bind(self.net)

    @property
    def net(self) -> MatchingModel:
        return self.retriever if self.retriever is not None else self.model

    def describe(self) -> str:
        what = (f"global_embeddings of the model ({self.model.name})" if self.retriever is None
                else f"global_embeddings of the retriever ({self.retriever.name})")
        return what + (" + the open-vocabulary concept vector" if self.open_vocab is not None else "")

    @torch.no_grad()
    def image_vectors(self, feats: torch.Tensor | None, img: ImageEncoding) -> torch.Tensor:
        """Stage-1 photo vectors; with the open-vocabulary part, its concept vectors after the model's columns
        (zeros where only the stored encoding is at hand, ``feats`` None: a photo-to-photo query, which reads the
        embedding columns alone)."""
        net = self.net
        enc = img if net is self.model else net.encode_images(feats)
        vec = _global(net, enc, self._placeholder(net, "captions"))[0]
        if self.open_vocab is None:
            return vec
        part = (torch.zeros(len(vec), self.open_vocab.dim) if feats is None
                else self.open_vocab.photo_vectors(feats))
        return torch.cat([vec.float(), part.to(vec.device).float()], dim=1)

    @torch.no_grad()
    def text_vectors(self, captions: list[str], txt: TextEncoding | None, n_regions: int) -> torch.Tensor:
        """Stage-1 query vectors; with the open-vocabulary part, the query's sentence vector after the model's
        columns, weighted so that the inner product is the fused score (:mod:`vlmatch.search.open_vocab`)."""
        net = self.net
        if net is not self.model or txt is None:
            tokens, lengths = net.tokenize(captions)
            txt = net.encode_texts(tokens, lengths)
        vec = _global(net, self._placeholder(net, "images", n_regions), txt)[1]
        if self.open_vocab is None:
            return vec
        return torch.cat([vec.float(), self.open_vocab.query_vectors(captions).to(vec.device)], dim=1)

    def check(self, n_regions: int) -> int:
        """Fail early (before any encoding) when there is no stage-1 part; returns its dimension."""
        feats = torch.zeros(1, n_regions, self.net.cfg.img_dim)
        return int(self.image_vectors(feats, template(self.model, "images", n_regions)).shape[1])


@dataclass
class Batch:
    consumed: int  # inputs used up by this batch (kept + skipped)
    keys: list  # the kept inputs, in row order
    features: torch.Tensor | None = None  # images: (B, k, img_dim)
    captions: list[str] | None = None  # captions: the texts
    bad: list[dict] = field(default_factory=list)
    meta: list[dict] | None = None  # per kept input, what its table row records (a file's size, hash ...)


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def encode_part(folder, fp: str, n: int, batches: Callable[[int], Iterator[Batch]], encode, dtype: str, *,
                pad_to: int | None = None, desc: str = "encode", progress: bool = True) -> dict:
    """Encode ``n`` inputs into ``folder`` (stage1.npy, enc/, each row's ``Batch.meta`` a line of ``meta.jsonl``),
    resuming a run with the same ``fp``. ``batches(done)`` yields the :class:`Batch` es after the first ``done``
    inputs; ``encode(batch) -> (Encoding, stage-1 (B, d))``. Returns the progress record: rows ``written`` (the inputs
    in order minus the ``bad`` ones, each ``{"key", "error"}``); a part whose every input was skipped has no files."""
    folder = Path(folder)
    prog_path = folder / "progress.json"
    meta_path = folder / "meta.jsonl"
    prog = read_json(prog_path) if prog_path.is_file() else None
    if prog is not None and prog.get("fingerprint") == fp and not _trim_lines(meta_path, prog["written"]):
        prog = None  # rows the record counts lost their lines (a crash before they reached the disk): redo
    if prog is not None and prog.get("complete") and not (folder / "stage1.npy").is_file():
        prog = None  # finished, and its rows already moved into an index that was then not completed
    if prog is None or prog.get("fingerprint") != fp:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        prog = {"fingerprint": fp, "done": 0, "written": 0, "bad": [], "complete": False}
    if prog["complete"]:
        return prog
    writer = EncodingWriter(folder / "enc", n, dtype, pad_to)
    stage1_path = folder / "stage1.npy.partial"
    if stage1_path.is_file():
        reserve(stage1_path)  # a killed run's file may not hold its blocks yet: a full disk named, not SIGBUS
    stage1 = np.load(stage1_path, mmap_mode="r+") if stage1_path.is_file() else None
    bar = tqdm(total=n, initial=prog["done"], desc=desc, unit="item", disable=not progress, leave=False)
    for b in batches(prog["done"]):
        if b.keys:
            enc, vec = encode(b)
            vec = vec.detach().cpu().float().numpy()
            if not np.isfinite(vec).all():
                raise VlmatchError(f"{desc}: the model gave NaN or inf stage-1 vectors for {b.keys[0]} .. {b.keys[-1]}")
            if stage1 is None:
                stage1 = allocate_npy(stage1_path, np.float32, (n, vec.shape[1]))
            w = prog["written"]
            writer.write(w, enc)
            stage1[w:w + len(vec)] = vec
            writer.flush()
            stage1.flush()
            lines = "".join(json.dumps(m) + "\n" for m in (b.meta or [{}] * len(b.keys))).encode("utf-8")
            with open(meta_path, "ab", buffering=0) as f:  # durable before the record counts these rows
                end = f.tell()
                try:
                    if f.write(lines) != len(lines):  # a short write: the disk took part of it
                        raise OSError(28, "No space left on device")
                    os.fsync(f.fileno())
                except OSError as e:  # a full disk: the rows the record counts stay whole, the file is named
                    os.ftruncate(f.fileno(), end)
                    raise DataError(meta_path, f"could not be written: {e.strerror or e}; free space and run the "
                                               "command again (it resumes)") from None
        prog["done"] += b.consumed
        prog["written"] += len(b.keys)
        prog["bad"] += b.bad
        write_json(prog_path, prog, indent=None)
        bar.update(b.consumed)
    bar.close()
    rows = prog["written"]
    if rows:
        writer.finish(rows)
        if rows < n:
            save_npy(folder / "stage1.npy", np.asarray(stage1[:rows]))
            del stage1
            stage1_path.unlink()
        else:
            del stage1
            stage1_path.replace(folder / "stage1.npy")
    prog["complete"] = True
    write_json(prog_path, prog, indent=None)
    return prog


def read_meta(folder) -> list[dict]:
    """The ``Batch.meta`` of a finished part's rows, in row order."""
    path = Path(folder) / "meta.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def _trim_lines(path: Path, rows: int) -> bool:
    """Keep the first ``rows`` lines of ``path`` (a kill may have left lines of a batch the progress
    record does not count yet); False when it has fewer whole lines than that."""
    lines = path.read_bytes().splitlines(keepends=True) if path.is_file() else []
    if sum(line.endswith(b"\n") for line in lines[:rows]) < rows:
        return False
    if len(lines) > rows:
        write_bytes(path, b"".join(lines[:rows]))
    return True
