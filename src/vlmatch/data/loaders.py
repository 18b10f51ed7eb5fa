"""Torch datasets and collate functions over a :class:`PrecompSplit`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from .mirror import names_a_side
from .precomp import PrecompSplit
from .vocab import Vocab


def token_lists(tokenize, captions: list[str], chunk: int = 4096) -> list[list[int]]:
    """Unpadded token ids of ``captions`` through a ``tokenize(captions) -> (tokens, lengths)``."""
    out: list[list[int]] = []
    for a in range(0, len(captions), chunk):
        toks, lens = tokenize(list(captions[a:a + chunk]))
        out += [row[:n].tolist() for row, n in zip(toks, lens.tolist(), strict=True)]
    return out


def encode_captions(split: PrecompSplit, text) -> list[list[int]]:
    """Token ids of every caption of ``split``; ``text`` is a model (its own ``tokenize``) or a Vocab."""
    if isinstance(text, Vocab):
        return [text.encode(cap) for cap in split.captions]
    return token_lists(text.tokenize, split.captions)


class CaptionDataset(Dataset):
    """(caption ids, caption index) for each caption; the pair datasets below add to its rows."""

    def __init__(self, split: PrecompSplit, text, tokens: list[list[int]] | None = None):
        self.split = split
        self.tokens = tokens if tokens is not None else encode_captions(split, text)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, j: int):
        return self.tokens[j], j


class PairDataset(CaptionDataset):
    """(image features, caption ids, caption index, image index, mirrored) for each caption. ``mirror``: the chance
    a pair shows its image's mirror view, drawn per (seed, epoch); a caption naming a side keeps the photo."""

    def __init__(self, split: PrecompSplit, text, mirror: float = 0.0):
        super().__init__(split, text)
        self.mirror = float(mirror)
        self.mirrored = np.zeros(len(self.tokens), dtype=bool)
        if self.mirror > 0:
            split.mirror_image(0)  # a missing or mismatched file: said now, before any training
            self._sided = np.array([names_a_side(c) for c in split.captions[: len(self.tokens)]], dtype=bool)
            self.set_epoch(0, 0)

    def set_epoch(self, seed: int, epoch: int) -> None:
        if self.mirror <= 0:
            return
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 104_729)
        self.mirrored = (torch.rand(len(self.tokens), generator=g).numpy() < self.mirror) & ~self._sided

    def __getitem__(self, j: int):
        i = self.split.image_of_caption(j)
        flip = bool(self.mirrored[j])
        return self.split.mirror_image(i) if flip else self.split.image(i), self.tokens[j], j, i, flip


class CaptionPairDataset(CaptionDataset):
    """(anchor ids, partner ids, anchor index, partner index, image index) for each caption: the partner is another
    caption of the same image (MTFN's text-text positive), drawn per (seed, epoch); a lone caption pairs itself."""

    def __init__(self, split: PrecompSplit, text):
        super().__init__(split, text)
        self.set_epoch(0, 0)

    def set_epoch(self, seed: int, epoch: int) -> None:
        per = self.split.per_image
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7919)
        shift = torch.randint(1, max(per, 2), (len(self.tokens),), generator=g).numpy() % max(per, 1)
        j = np.arange(len(self.tokens))
        self.partner = (j // per) * per + (j % per + shift) % per

    def __getitem__(self, j: int):
        q = int(self.partner[j])
        return self.tokens[j], self.tokens[q], j, q, self.split.image_of_caption(j)


class ImageDataset(Dataset):
    def __init__(self, split: PrecompSplit):
        self.split = split

    def __len__(self) -> int:
        return self.split.n_images

    def __getitem__(self, i: int):
        return self.split.image(i), i


def pad_tokens(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.tensor(s, dtype=torch.long) for s in seqs]
    return pad_sequence(rows, batch_first=True), torch.tensor([len(s) for s in seqs], dtype=torch.long)


def collate_pairs(batch):
    feats, caps, cap_idx, img_idx, *mirrored = zip(*batch, strict=True)
    tokens, lengths = pad_tokens(list(caps))
    return {
        "features": torch.from_numpy(np.stack(feats)),
        "tokens": tokens,
        "lengths": lengths,
        "caption_index": torch.tensor(cap_idx),
        "image_index": torch.tensor(img_idx),
        # which rows show their image's mirror view (PairDataset's data.mirror)
        "mirrored": torch.tensor(mirrored[0] if mirrored else [False] * len(cap_idx), dtype=torch.bool),
    }


def collate_caption_pairs(batch):
    a, b, ia, ib, img = zip(*batch, strict=True)
    tokens, lengths = pad_tokens(list(a))
    tokens2, lengths2 = pad_tokens(list(b))
    return {"tokens": tokens, "lengths": lengths, "tokens2": tokens2, "lengths2": lengths2,
            "caption_index": torch.tensor(ia), "partner_index": torch.tensor(ib), "image_index": torch.tensor(img)}


def collate_images(batch):
    feats, idx = zip(*batch, strict=True)
    return {"features": torch.from_numpy(np.stack(feats)), "index": torch.tensor(idx)}


def collate_captions(batch):
    caps, idx = zip(*batch, strict=True)
    tokens, lengths = pad_tokens(list(caps))
    return {"tokens": tokens, "lengths": lengths, "index": torch.tensor(idx)}


def caption_loader(split: PrecompSplit, text, batch_size: int = 128, num_workers: int = 0,
                   tokens=None) -> DataLoader:
    """Batches of tokenised captions; ``text`` is a model or a Vocab (see :func:`encode_captions`)."""
    return DataLoader(CaptionDataset(split, text, tokens), batch_size=batch_size, shuffle=False,
                      num_workers=num_workers, collate_fn=collate_captions)


@dataclass(frozen=True)
class BatchKind:
    """A kind of training batch: its dataset, collate function, and the model inputs it yields."""

    dataset: Callable  # (split, model) -> Dataset
    collate: Callable
    inputs: Callable  # (batch, device) -> tuple passed to model(...)


BATCH_KINDS: dict[str, BatchKind] = {
    # (image, caption) pairs: model(features, mask, tokens, lengths) -> (B, B) scores
    "image_caption": BatchKind(PairDataset, collate_pairs, lambda b, d: (
        b["features"].to(d), None, b["tokens"].to(d), b["lengths"].to(d))),
    # (caption, other caption of the same image) pairs: model(tokens, lengths, tokens2, lengths2)
    "caption_pair": BatchKind(CaptionPairDataset, collate_caption_pairs, lambda b, d: (
        b["tokens"].to(d), b["lengths"].to(d), b["tokens2"].to(d), b["lengths2"].to(d))),
}


def batch_kind(name: str) -> BatchKind:
    if name not in BATCH_KINDS:
        from ..errors import ConfigError

        raise ConfigError(f"unknown batch kind {name!r}; known: {sorted(BATCH_KINDS)}")
    return BATCH_KINDS[name]
