"""Ranking losses over a batch score matrix ``scores[i, j]`` = s(image i, caption j), positives on
the diagonal."""

from __future__ import annotations

import torch
from torch import Tensor


def hinge_triplet(scores: Tensor, margin: float = 0.2, max_violation: bool = False,
                  image_ids: Tensor | None = None) -> Tensor:
    """VSE++ / SCAN hinge triplet loss, both directions, summed over the batch.

    ``max_violation=False`` sums the hinge over all negatives; ``True`` keeps only the hardest
    negative of each query (VSE++). ``image_ids`` (B,) marks pairs that share an image: such
    off-diagonal entries are true matches and are not used as negatives.
    """
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be a square batch matrix, got {tuple(scores.shape)}")
    pos = scores.diagonal()
    cost_cap = (margin + scores - pos[:, None]).clamp(min=0)  # image i as query, captions negative
    cost_img = (margin + scores - pos[None, :]).clamp(min=0)  # caption j as query, images negative
    n = scores.shape[0]
    same = torch.eye(n, dtype=torch.bool, device=scores.device)
    if image_ids is not None:
        same = same | (image_ids[:, None] == image_ids[None, :])
    cost_cap = cost_cap.masked_fill(same, 0.0)
    cost_img = cost_img.masked_fill(same, 0.0)
    if max_violation:
        return cost_cap.amax(dim=1).sum() + cost_img.amax(dim=0).sum()
    return cost_cap.sum() + cost_img.sum()


def intra_pair_hinge(positive_scores: Tensor, n_levels: int, margin: float = 0.25) -> Tensor:
    """SMAN's intra-pair term (eq. 22, read as the text states it): each positive pair's distance
    ``n_levels - d`` (the summed cosine distance of a score d = Σ_k cos) is pushed below ``margin``;
    summed over the pairs, once image-anchored and once text-anchored (the same distance)."""
    return 2 * (n_levels - positive_scores - margin).clamp(min=0).sum()
