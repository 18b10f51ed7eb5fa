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
    same = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    if image_ids is not None:
        same = same | (image_ids[:, None] == image_ids[None, :])
    cost_cap = (margin + scores - pos[:, None]).clamp(min=0).masked_fill(same, 0.0)  # image i as query
    cost_img = (margin + scores - pos[None, :]).clamp(min=0).masked_fill(same, 0.0)  # caption j as query
    if max_violation:
        return cost_cap.amax(dim=1).sum() + cost_img.amax(dim=0).sum()
    return cost_cap.sum() + cost_img.sum()


def intra_pair_hinge(positive_scores: Tensor, n_levels: int, margin: float = 0.25, per_level: bool = False) -> Tensor:
    """SMAN's intra-pair term (eq. 22, read as the text states it): each positive pair's distance
    ``n_levels - d`` (the summed cosine distance of a score d = Σ_k cos) is pushed below ``margin``;
    summed over the pairs, once image-anchored and once text-anchored (the same distance).
    ``per_level``: the distance is the mean over the levels instead, ``1 - d / n_levels``."""
    dist = n_levels - positive_scores
    if per_level:
        dist = dist / n_levels
    return 2 * (dist - margin).clamp(min=0).sum()


def caption_pair_triplet(scores: Tensor, image_ids: Tensor, margin: float = 0.2, max_violation: bool = True) -> Tensor:
    """MTFN's text-text loss (eq. 7) on a (B, 2B) matrix ``scores[p, q]`` = S_TT(anchor p, caption q),
    where columns 0..B-1 are the anchors' partners (caption q of the same image: the positive on the
    diagonal) and columns B..2B-1 the anchors themselves. ``image_ids`` (B,) is each pair's image.

    Negatives of anchor p are the batch's captions of other images (anchors and partners alike);
    ``max_violation`` keeps only the hardest one, else the hinge is summed over all of them.
    """
    n = scores.shape[0]
    if scores.dim() != 2 or scores.shape[1] != 2 * n or image_ids.shape != (n,):
        raise ValueError(f"expected (B, 2B) scores and (B,) image ids, got {tuple(scores.shape)}, "
                         f"{tuple(image_ids.shape)}")
    pos = scores[:, :n].diagonal()
    cols = torch.cat([image_ids, image_ids])
    cost = (margin + scores - pos[:, None]).clamp(min=0).masked_fill(image_ids[:, None] == cols[None, :], 0.0)
    return cost.amax(dim=1).sum() if max_violation else cost.sum()


def pointing_loss(maps: Tensor, targets: Tensor, temperature: float = 0.2, form: str = "mass",
                  margin: float = 1.0) -> Tensor:
    """The grounding objective: pull each phrase's heat map into its boxes.

    ``maps`` (P, k): each phrase's weights over the k image positions (any scale: each map is standardised
    to zero mean and unit spread first, so the term cannot be met by scaling the scores); ``targets``
    (P, k) bool: the positions inside the phrase's boxes. The loss is the mean over phrases of
    -log Σ_{i in boxes} softmax_i(map / temperature): the probability mass inside the boxes (one in-box
    position may carry it, as the pointing game asks), not a fit to every in-box position.

    ``form="peak"`` asks only what the pointing game scores: the map's (soft) maximum inside the boxes above its
    (soft) maximum outside by ``margin`` standard deviations, relu(margin + smax(z_out) - smax(z_in)) with
    smax(x) = temperature * logsumexp(x / temperature); a phrase whose boxes hold every position adds 0."""
    if maps.shape != targets.shape or maps.dim() != 2:
        raise ValueError(f"maps and targets must both be (phrases, positions), got {tuple(maps.shape)} and "
                         f"{tuple(targets.shape)}")
    if maps.shape[0] == 0:
        return maps.sum() * 0.0
    z = (maps - maps.mean(dim=1, keepdim=True)) / (maps.std(dim=1, keepdim=True) + 1e-6)
    if form == "peak":
        some_out = (~targets).any(dim=1)
        if not bool(some_out.any()):
            return maps.sum() * 0.0
        z, inside_cells = z[some_out], targets[some_out]
        top_in = temperature * torch.logsumexp(z.masked_fill(~inside_cells, float("-inf")) / temperature, dim=1)
        top_out = temperature * torch.logsumexp(z.masked_fill(inside_cells, float("-inf")) / temperature, dim=1)
        return (margin + top_out - top_in).clamp(min=0).sum() / maps.shape[0]
    if form != "mass":
        raise ValueError(f"grounding form must be mass or peak, not {form!r}")
    logp = torch.log_softmax(z / temperature, dim=1)
    inside = torch.logsumexp(logp.masked_fill(~targets, float("-inf")), dim=1)
    return -inside.mean()
