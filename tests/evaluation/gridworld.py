"""A tiny grid world for the pointing game: each image is a 3 x 3 grid of cells, each object sits in one cell
(its feature is the object's code there, the other cells are noise), captions name two objects, and an
Entities folder in the Flickr30k format holds each phrase's box (the object's cell, in a 90 x 60 photo).

``OracleModel`` is a hand-made matching model whose contribution map of a word is the match of the word's
code with each cell: it points at the named object by construction."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vlmatch.models.base import ImageEncoding, MatchingModel, ModelConfig, TextEncoding

WORDS = ["<pad>", "<start>", "<end>", "a", "and", "dog", "car", "cat", "kite"]
OBJECTS = WORDS[5:]
GRID, W, H, DIM = 3, 90, 60, 8


def make_gridworld(root, n_images: int = 12, seed: int = 0):
    """Write Sentences/ + Annotations/ under ``root``; return (features (N, 9, DIM), names, cells of objects)."""
    rng = np.random.default_rng(seed)
    (root / "Sentences").mkdir(parents=True)
    (root / "Annotations").mkdir()
    feats = rng.normal(0, 0.05, (n_images, GRID * GRID, DIM)).astype(np.float32)
    names, where = [], []
    for i in range(n_images):
        objs = rng.choice(len(OBJECTS), 2, replace=False)
        cells = rng.choice(GRID * GRID, 2, replace=False)
        name = f"{1000 + i}_x.jpg"
        names.append(name)
        where.append(dict(zip((OBJECTS[o] for o in objs), cells.tolist(), strict=True)))
        xml = [f"<annotation><size><width>{W}</width><height>{H}</height></size>"]
        for o, c in zip(objs, cells, strict=True):
            feats[i, c, o] += 1.0
            r, q = divmod(int(c), GRID)
            cw, ch = W // GRID, H // GRID
            xml.append(f"<object><name>{o + 1}</name><bndbox><xmin>{q * cw + 1}</xmin><ymin>{r * ch + 1}</ymin>"
                       f"<xmax>{(q + 1) * cw}</xmax><ymax>{(r + 1) * ch}</ymax></bndbox></object>")
        xml.append("</annotation>")
        (root / "Annotations" / f"{1000 + i}.xml").write_text("".join(xml))
        a, b = (OBJECTS[o] for o in objs)
        (root / "Sentences" / f"{1000 + i}.txt").write_text(
            f"[/EN#{objs[0] + 1}/animals a {a}] and [/EN#{objs[1] + 1}/other a {b}]\n"
            f"[/EN#{objs[1] + 1}/other a {b}] and [/EN#0/notvisual a {a}]\n")
    return feats, names, where


@dataclass
class OracleConfig(ModelConfig):
    img_dim: int = DIM


class OracleModel(MatchingModel):
    """Score = Σ_ij v_i · code(word_j); its words are WORDS, its contribution map exact by construction."""

    Config = OracleConfig
    name = "oracle"

    def __init__(self):
        super().__init__(OracleConfig())
        self.codes = torch.zeros(len(WORDS), DIM)
        for k in range(len(OBJECTS)):
            self.codes[5 + k, k] = 1.0

    def tokenize(self, captions):
        seqs = [[1] + [WORDS.index(w) for w in c.lower().split()] + [2] for c in captions]
        n = max(len(s) for s in seqs)
        return torch.tensor([s + [0] * (n - len(s)) for s in seqs]), torch.tensor([len(s) for s in seqs])

    def decode_tokens(self, tokens, length):
        return [WORDS[int(t)] for t in tokens[:length]]

    def encode_images(self, features, mask=None):
        return ImageEncoding(regions=features if mask is None else features * mask[..., None], mask=mask)

    def encode_texts(self, tokens, lengths):
        return TextEncoding(lengths=lengths, words=self.codes[tokens])

    def score(self, img, txt):
        return torch.einsum("akd,bld->ab", img.regions, txt.words)

    def position_contributions(self, features, mask, tokens, lengths):
        v = features if mask is None else features * mask[..., None]
        return torch.einsum("bkd,bld->bkl", v, self.codes[tokens])

    def pair_attention(self, img, txt):
        return {"weights": torch.einsum("kd,ld->kl", img.regions[0], txt.words[0]).numpy(), "axis": "pair"}
