"""The grounding objective of training (``train.grounding_loss``): each train phrase's map pulled into its Flickr30k
Entities boxes (docs/grounding.md, "The grounding objective"). Targets are built once per run from the train
split only (val's boxes are never read); a row showing its mirror view has its target cells mirrored too.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import torch
from torch import Tensor

from ..data.entities import EntitiesDir
from ..data.mirror import mirror_grid
from ..data.precomp import PrecompSplit
from ..errors import ConfigError, DataError, VlmatchError
from ..evaluation.explainers import gradient_maps
from ..models.base import MatchingModel
from ..models.losses import pointing_loss

_WORD = re.compile(r"[a-z0-9]+")


def _norm_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _word_starts(text: str) -> list[tuple[int, int]]:
    """Character spans of the normalised words of ``text`` (the same words as :func:`_norm_words`)."""
    return [(m.start(), m.end()) for m in _WORD.finditer(text.lower())]


def target_cells(boxes, width: float, height: float, grid: int) -> np.ndarray:
    """(g*g,) bool: the cells whose centre lies in one of the boxes; a box that holds no centre adds the cell
    under its own centre (a small thing still has somewhere to point)."""
    from ..data.entities import in_box

    c = (np.arange(grid) + 0.5) / grid
    out = np.zeros(grid * grid, dtype=bool)
    for b in boxes:
        inside = [r * grid + q for r in range(grid) for q in range(grid) if in_box(c[q] * width, c[r] * height, b)]
        if inside:
            out[inside] = True
        else:
            cx, cy = (b[0] - 1 + b[2]) / 2 / width, (b[1] - 1 + b[3]) / 2 / height
            out[min(grid - 1, int(cy * grid)) * grid + min(grid - 1, int(cx * grid))] = True
    return out


class GroundingTargets:
    """Every grounded phrase of a split's captions: caption index, token span [a, b), target cells."""

    def __init__(self, split: PrecompSplit, model: MatchingModel, entities, progress: bool = False):
        from tqdm.auto import tqdm

        from ..evaluation.explainers import token_spans

        ents = entities if isinstance(entities, EntitiesDir) else EntitiesDir(entities)
        if split.ids is None:
            raise DataError(split.root / f"{split.split}_ids.txt", "missing: the grounding objective needs the image "
                                                                  "names (features extract writes them)")
        k = split.n_regions
        grid = int(round(k ** 0.5))
        if grid * grid != k:
            raise ConfigError(f"train.grounding_loss needs grid features: {k} positions are not a square grid")
        self.grid = grid
        rows, spans, cells, texts = [], [], [], []
        self.captions_matched = self.captions_total = self.images_without_entities = 0
        for i, name in enumerate(tqdm(split.ids, desc="grounding targets", unit="img", leave=False, disable=not progress)):
            first = i * split.per_image
            mine = split.captions[first:first + split.per_image]
            self.captions_total += len(mine)
            if not ents.has(name):
                self.images_without_entities += 1
                continue
            sentences, ann, phrases = ents.grounded(name)
            by_words = {tuple(_norm_words(s.text)): si for si, s in enumerate(sentences)}
            for ci, caption in enumerate(mine):
                si = by_words.get(tuple(_norm_words(caption)))
                if si is None:
                    continue
                self.captions_matched += 1
                src, dst = _word_starts(sentences[si].text), _word_starts(caption)
                char_spans, targets = [], []
                for gp in (g for g in phrases if g.caption == si):
                    words = [w for w, (a, b) in enumerate(src) if a >= gp.phrase.start and b <= gp.phrase.end]
                    if not words:
                        continue
                    char_spans.append((dst[words[0]][0], dst[words[-1]][1]))
                    targets.append(target_cells(gp.boxes, ann.width, ann.height, grid))
                for (a, b), (x, y), t in zip(token_spans(model, caption, char_spans), char_spans, targets,
                                             strict=True):
                    if b > a:
                        rows.append(first + ci)
                        spans.append((a, b))
                        cells.append(t)
                        texts.append(caption[x:y])
        if not rows:
            raise ConfigError(f"train.grounding_loss: no caption of {split.captions_path} matched a phrase with a box "
                              f"in {ents.root} (is it the Entities folder of these images?)")
        self.caption = torch.tensor(rows, dtype=torch.long)  # ascending (images and captions in order): searchsorted
        self.span = torch.tensor(spans, dtype=torch.long)
        self.cells = torch.from_numpy(np.stack(cells))
        self.texts = texts  # each phrase as its caption writes it
        if progress:
            print(f"[grounding] {len(rows)} phrases with boxes from {self.captions_matched}/{self.captions_total} train "
                  f"captions ({self.images_without_entities} images without Entities files)", file=sys.stderr)

    def _index(self, caption_index: Tensor) -> tuple[Tensor, Tensor]:
        lo = torch.searchsorted(self.caption, caption_index)
        hi = torch.searchsorted(self.caption, caption_index, right=True)
        rows = torch.repeat_interleave(torch.arange(len(caption_index)), hi - lo)
        idx = torch.cat([torch.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]) \
            if len(caption_index) else torch.zeros(0, dtype=torch.long)
        return rows, idx

    def of_batch(self, caption_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The phrases of a batch's captions: (batch row, span, cells) of each."""
        rows, idx = self._index(caption_index)
        return rows, self.span[idx], self.cells[idx]

    def texts_of_batch(self, caption_index: Tensor) -> list[str]:
        """The texts of :meth:`of_batch`'s phrases, in its order."""
        return [self.texts[i] for i in self._index(caption_index)[1].tolist()]


def _maps_of(model: MatchingModel, kind: str):
    """The model's batched (B, k, L) maps of ``train.grounding_map`` ``kind`` (the token kinds)."""
    return model.position_attention if kind == "attention" else model.position_contributions


def check_grounding_map(model: MatchingModel, kind: str) -> None:
    """A one-line ConfigError, before any training, when ``model`` cannot give ``kind``'s maps."""
    if kind == "gradient":
        return  # every model has a gradient
    probe = torch.zeros(1, 1, model.cfg.img_dim, dtype=next(model.parameters()).dtype)
    tokens, lengths = model.tokenize(["a"])
    try:
        with torch.no_grad():
            _maps_of(model, kind)(probe, None, tokens, lengths)
    except VlmatchError as e:
        raise ConfigError(f"train.grounding_map: {kind}: {e}") from None


def grounding_term(model: MatchingModel, targets: GroundingTargets, batch: dict, inputs: tuple, temperature: float,
                   form: str = "mass", *, kind: str = "contribution") -> Tensor:
    """The batch's grounding loss: its phrases' maps against their boxes. ``kind``: "contribution" or "attention"
    (a phrase's map is the sum of its tokens' columns, as the pointing game sums them) or "gradient" (each phrase
    scored as its own query). ``inputs``: the step's matching-pass tensors, whose encodings are reused."""
    rows, span, cells = targets.of_batch(batch["caption_index"])
    if "mirrored" in batch and bool(batch["mirrored"].any()):  # a row showing its mirror view: its boxes mirrored
        flip = batch["mirrored"][rows]
        cells = torch.where(flip[:, None], mirror_grid(cells.T, targets.grid).T, cells)
    features, mask, tokens, lengths = inputs
    if len(rows) == 0:
        return torch.zeros((), device=features.device)
    if kind == "gradient":
        sel = rows.to(features.device)
        maps = gradient_maps(model, features[sel], None if mask is None else mask[sel],
                             targets.texts_of_batch(batch["caption_index"]), create_graph=True)
        return pointing_loss(maps, cells.to(maps.device), temperature, form)
    contrib = _maps_of(model, kind)(features, mask, tokens, lengths)  # (B, k, L)
    device = contrib.device
    pos = torch.arange(contrib.shape[2], device=device)
    span = span.to(device)
    in_span = ((pos[None] >= span[:, :1]) & (pos[None] < span[:, 1:])).to(contrib.dtype)  # (P, L)
    maps = torch.einsum("pkl,pl->pk", contrib[rows.to(device)], in_span)
    return pointing_loss(maps, cells.to(device), temperature, form)
