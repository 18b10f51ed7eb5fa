"""The scoring engine: the full (images x captions) score matrix in memory-bounded blocks.

Images are encoded once and kept; captions are encoded chunk by chunk (sorted by length, so little padding) and
every chunk is scored against every image block with the model's own ``score``, the function training uses.
The default budget keeps a block's workspace cache-sized (why: docs/evaluation.md). Under torchrun each rank
scores a contiguous run of whole image blocks (:func:`shard_rows`) and rank 0 gathers them (:func:`gather_rows`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import distributed as D
from ..data.loaders import ImageDataset, caption_loader, collate_images, encode_captions
from ..data.precomp import PrecompSplit
from ..data.vocab import Vocab
from ..errors import ConfigError
from ..models.base import Encoding, ImageEncoding, MatchingModel, TextEncoding

DEFAULT_BUDGET = 32 * 2**20


@dataclass
class BlockPlan:
    images: int
    captions: int

    @classmethod
    def for_budget(cls, model: MatchingModel, n_img: int, n_cap: int, n_regions: int, n_words: int,
                   budget: int = DEFAULT_BUDGET) -> BlockPlan:
        pairs = max(1, budget // max(1, model.bytes_per_pair(n_regions, n_words)))
        ni = min(n_img, max(1, math.isqrt(pairs)))
        nc = min(n_cap, max(1, pairs // ni))
        if nc == n_cap and ni < n_img:  # all captions fit: spend the rest on images
            ni = min(n_img, max(1, pairs // nc))
        return cls(ni, nc)


def shard_rows(n_rows: int, block: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows [start, stop) of rank ``rank``: a contiguous run of whole ``block``-row blocks, so every
    rank scores exactly the blocks a single process would (hence the same floats)."""
    n_blocks = -(-n_rows // block)
    lo, hi = rank * n_blocks // world_size, (rank + 1) * n_blocks // world_size
    return min(n_rows, lo * block), min(n_rows, hi * block)


@torch.no_grad()
def encode_all_images(model: MatchingModel, split: PrecompSplit, batch_size: int = 128, device="cpu",
                      progress: bool = True, rows: tuple[int, int] | None = None) -> ImageEncoding:
    """Encodings of every image (or of ``rows`` [start, stop)), in batches of ``batch_size`` counted
    from image 0 whatever ``rows`` is, so a shard's encodings equal the same rows of the full run."""
    start, stop = rows or (0, split.n_images)
    first = start // batch_size * batch_size
    batches = [list(range(b, min(b + batch_size, split.n_images))) for b in range(first, stop, batch_size)]
    parts = []
    loader = DataLoader(ImageDataset(split), batch_sampler=batches, collate_fn=collate_images)
    for batch in tqdm(loader, desc="encode images", disable=not progress, leave=False):
        parts.append(model.encode_images(batch["features"].to(device), None))
    return Encoding.cat(parts).select(slice(start - first, stop - first))


@torch.no_grad()
def encode_all_captions(model: MatchingModel, split: PrecompSplit, batch_size: int = 256, device="cpu",
                        progress: bool = False) -> TextEncoding:
    """Encodings of every caption of ``split``, tokenised by the model, in caption order."""
    return Encoding.cat([model.encode_texts(b["tokens"].to(device), b["lengths"].to(device))
                         for b in tqdm(caption_loader(split, model, batch_size=batch_size), desc="encode captions",
                                       disable=not progress, leave=False)])


@torch.no_grad()
def score_blocks(model: MatchingModel, images: ImageEncoding, caption_chunks, n_captions: int,
                 block_images: int, *, progress: bool = True, desc: str = "scoring", compile: bool = False,
                 block_captions: int | None = None) -> np.ndarray:
    """Fill an (n_images, n_captions) float32 matrix from ``(column_index, TextEncoding)`` chunks.

    ``compile=True``: ``model.score`` through ``torch.compile`` at one block shape (images padded to whole blocks,
    captions to ``block_captions`` + 1 filler, words to a multiple of ``COMPILE_WORD_STEP``; fillers dropped)."""
    score = compiled_score(model) if compile else model.score
    n_img = len(images)
    if compile:
        images = pad_rows(images, -(-n_img // block_images) * block_images)
    sims = np.empty((n_img, n_captions), dtype=np.float32)
    bar = tqdm(total=n_img * n_captions, desc=desc, unit="pair", unit_scale=True, disable=not progress, leave=False)
    for cols, txt in caption_chunks:
        cols = np.asarray(cols)
        if compile:
            block_captions = block_captions or len(cols)
            txt = pad_texts(txt, block_captions + 1, COMPILE_WORD_STEP)
        for a in range(0, n_img, block_images):
            blk = score(images.select(slice(a, a + block_images)), txt)[: min(block_images, n_img - a), : len(cols)]
            sims[a:a + block_images, cols] = blk.float().cpu().numpy()
            bar.update(blk.numel())
    bar.close()
    return sims


COMPILE_WORD_STEP = 8


def pad_rows(enc: Encoding, rows: int) -> Encoding:
    """``enc`` with its last item repeated up to ``rows`` items (filler rows for a fixed block shape)."""
    extra = rows - len(enc)
    if extra <= 0:
        return enc
    return Encoding.cat([enc, enc.select([len(enc) - 1] * extra)])


def pad_texts(txt: TextEncoding, rows: int, word_step: int) -> TextEncoding:
    """Captions padded to ``rows`` (at least one filler) and their word axis to a multiple of
    ``word_step``; the fillers claim the full width, so ``trim()`` keeps that width."""
    if txt.words is None:
        return pad_rows(txt, rows)
    width = -(-txt.words.shape[1] // word_step) * word_step
    out = pad_rows(txt, rows)
    cut = {}
    for f in txt.per_word_fields:
        t = getattr(out, f)
        if t is not None and t.shape[1] < width:
            cut[f] = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]))
    lengths = out.lengths.clone()
    lengths[len(txt):] = width
    return dataclasses.replace(out, lengths=lengths, **cut)


def compiled_score(model: MatchingModel):
    """``model.score`` compiled once per model (kept on the model so recompiles are avoided)."""
    fn = getattr(model, "_compiled_score", None)
    if fn is None:
        fn = torch.compile(model.score, dynamic=False)
        model._compiled_score = fn
    return fn


@torch.no_grad()
def model_scores(model: MatchingModel, split: PrecompSplit, vocab: Vocab | None = None, device="cpu", *,
                 budget: int = DEFAULT_BUDGET, progress: bool = True, plan: BlockPlan | None = None,
                 compile: bool = False, shard: bool = True) -> np.ndarray | None:
    """The full score matrix of ``model`` on ``split`` (rows images, columns captions), captions tokenised by
    ``model.tokenize`` (or by ``vocab`` when given). Under torchrun (``shard=True``) every rank must call it: each
    scores its run of image blocks (:func:`shard_rows`); rank 0 returns the whole matrix, the others None."""
    rank, world_size = D.world() if shard else (0, 1)
    with model.evaluating():
        text = vocab if vocab is not None else model
        tokens = encode_captions(split, text)
        order = np.argsort([len(t) for t in tokens], kind="stable")
        sorted_tokens = [tokens[j] for j in order]
        n_words = max(len(t) for t in tokens)
        plan = plan or BlockPlan.for_budget(model, split.n_images, len(tokens), split.n_regions, n_words, budget)
        rows = shard_rows(split.n_images, plan.images, rank, world_size)
        if rows[0] == rows[1]:  # more ranks than image blocks: this one has nothing to score
            return gather_rows(np.empty((0, len(tokens)), dtype=np.float32), split.n_images, plan.images, device)
        images = encode_all_images(model, split, device=device, progress=progress and rank == 0, rows=rows)

        def chunks():
            for batch in caption_loader(split, text, batch_size=plan.captions, tokens=sorted_tokens):
                txt = model.encode_texts(batch["tokens"].to(device), batch["lengths"].to(device))
                yield order[batch["index"].numpy()], txt

        sims = score_blocks(model, images, chunks(), len(tokens), plan.images, progress=progress and rank == 0,
                            compile=compile, block_captions=plan.captions)
        if world_size == 1:
            return sims
        return gather_rows(sims, split.n_images, plan.images, device)


@torch.no_grad()
def two_stage_scores(model: MatchingModel, split: PrecompSplit, top_k: int, device="cpu",
                     progress: bool = True, text_batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Two-stage retrieval matrices ``(i2t, t2i)`` for ``recall_metrics(i2t, t2i)``: stage 1 ranks every pair by
    ``global_embeddings``' inner product, stage 2 re-scores each image's top ``top_k`` captions (rows of ``i2t``)
    and each caption's top ``top_k`` images (columns of ``t2i``) with ``score``, lifted above the stage-1 rest."""
    with model.evaluating():
        images = encode_all_images(model, split, device=device, progress=progress)
        texts = encode_all_captions(model, split, text_batch, device)
        emb = model.global_embeddings(images, texts)
        if emb is None:
            raise ConfigError(f"model {model.name} has no global (stage-1) part: two-stage scoring needs one")
        s1 = (emb[0] @ emb[1].T).float().cpu().numpy()
        n_img, n_cap = s1.shape
        k_i2t, k_t2i = min(top_k, n_cap), min(top_k, n_img)
        cand_caps = np.argpartition(-s1, k_i2t - 1, axis=1)[:, :k_i2t]  # (n_img, K)
        cand_imgs = np.argpartition(-s1, k_t2i - 1, axis=0)[:k_t2i].T  # (n_cap, K)
        full_i2t = np.empty(cand_caps.shape, dtype=np.float32)
        full_t2i = np.empty(cand_imgs.shape, dtype=np.float32)
        bar = tqdm(total=n_img + n_cap, desc=f"re-score top {top_k}", disable=not progress, leave=False)
        for i in range(n_img):
            full_i2t[i] = model.score(images.select([i]), texts.select(torch.from_numpy(cand_caps[i])))[0].float().cpu()
            bar.update(1)
        for j in range(n_cap):
            full_t2i[j] = model.score(images.select(torch.from_numpy(cand_imgs[j])), texts.select([j]))[:, 0].float().cpu()
            bar.update(1)
        bar.close()
        lift = float(s1.max()) - float(min(full_i2t.min(), full_t2i.min())) + 1.0
        i2t, t2i = s1.copy(), s1.copy()
        np.put_along_axis(i2t, cand_caps, full_i2t + lift, axis=1)
        np.put_along_axis(t2i, cand_imgs.T, (full_t2i + lift).T, axis=0)
        return i2t, t2i


GATHER_CHUNK_BYTES = 64 * 2**20


def gather_rows(part: np.ndarray, n_rows: int, block: int, device="cpu") -> np.ndarray | None:
    """Rank 0 assembles the (n_rows, n_cols) matrix from every rank's :func:`shard_rows` part (point
    to point, in pieces of at most 64 MiB; tensors travel on ``device``, a GPU under nccl)."""
    import torch.distributed as dist

    rank, world_size = D.world()
    n_cols = part.shape[1]
    step = max(1, GATHER_CHUNK_BYTES // max(1, 4 * n_cols))
    if dist.get_backend() != "nccl":
        device = "cpu"
    if rank != 0:
        for a in range(0, len(part), step):
            dist.send(torch.from_numpy(np.ascontiguousarray(part[a:a + step])).to(device), dst=0)
        return None
    out = np.empty((n_rows, n_cols), dtype=np.float32)
    start, stop = shard_rows(n_rows, block, 0, world_size)
    out[start:stop] = part
    for src in range(1, world_size):
        start, stop = shard_rows(n_rows, block, src, world_size)
        for a in range(start, stop, step):
            buf = torch.empty((min(step, stop - a), n_cols), dtype=torch.float32, device=device)
            dist.recv(buf, src=src)
            out[a:a + len(buf)] = buf.cpu().numpy()
    return out


def checkpoint_scores(checkpoint, data, split, max_images=None, device="auto", progress=False, *, budget=None,
                      compile=False, calibrated: bool = True) -> np.ndarray | None:
    """The full score matrix of the checkpoint folder ``checkpoint`` on ``data``/``split`` (see
    :func:`model_scores`); launched by torchrun, this process joins the group and scores its share
    (rank 0 gets the matrix, the others None). ``calibrated=False``: without the query-bank calibration
    a checkpoint may keep (:mod:`vlmatch.models.calibration`), the model's raw scores."""
    from ..data.resolve import resolve_data
    from ..models.registry import load_checkpoint

    dev = D.setup(D.pick_device(device))  # joins the process group when launched by torchrun
    model = load_checkpoint(checkpoint, map_location=dev)
    if not calibrated:
        model.calibration = None
    sp = PrecompSplit(resolve_data(data), split, max_images=max_images)
    return model_scores(model, sp, device=dev, progress=progress, budget=budget or DEFAULT_BUDGET, compile=compile)
