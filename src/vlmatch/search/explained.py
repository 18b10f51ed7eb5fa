"""What an explanation's numbers are: the score ``search`` shows for a photo and a text, split into the ranking
model's part, which the heat maps split, and the open-vocabulary concept part, which no map can split (the concept
vector pools the photo's cells before a softmax): ``explain`` gives it as a number beside the maps.
"""

from __future__ import annotations

import numpy as np
import torch

# the maps' own score and the ranking model's part of the shown score agree to this (the stored float16 encodings,
# a batch of one against the build's batches); beyond it the maps split some other score and say so
SAME_SCORE = 2e-3

NOT_DRAWN = ("the concept part is a number, not drawn: the photo's concept vector pools its cells before a softmax, "
             "so it does not split over them")


@torch.no_grad()
def score_parts(index, item_id: int, text: str) -> dict:
    """``{"score", "ranker", "concepts"}`` of indexed photo ``item_id`` and ``text``: the score
    :meth:`vlmatch.Index.search` shows for that photo, its concept part (None without the open-vocabulary part, or
    where the score shown is the re-scorer's alone) and the rest (the ranking models')."""
    coll, key = index._key(item_id)
    txt, q = index.encode_queries([text])
    v = coll.stage1_vectors([key])[0]
    s1 = float(q[0] @ v)
    ov = index.stage1_source.open_vocab
    if index.stage1_is_score:
        shown, share = s1, 1.0
    else:
        from ..evaluation.scoring import score_blocks

        img = coll.take(np.array([key])).to(index.device)
        own = score_blocks(index.model, img, [(np.arange(1), txt)], 1, 1, progress=False)[:, 0]
        shown = float(index._fused(own, np.array([s1], dtype=np.float32))[0])
        share = 0.5 if index.score_mode == "mean" else 0.0
    concepts = share * float(q[0, -ov.dim:] @ v[-ov.dim:]) if ov is not None and share else None
    return {"score": shown, "ranker": shown - (concepts or 0.0), "concepts": concepts}


@torch.no_grad()
def photo_parts(model, ov, features, text: str) -> dict:
    """:func:`score_parts` of a photo outside any index, as an index of ``model`` with the open-vocabulary part
    ``ov`` (:class:`vlmatch.search.open_vocab.OpenVocab`) would score it: ``features`` its (k, img_dim) grid."""
    from .encode import Stage1Source

    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]
    source = Stage1Source(model, None, ov)
    v = source.image_vectors(feats, model.encode_images(feats))[0].float()
    q = source.text_vectors([text], None, feats.shape[1])[0].float()
    shown = float(q @ v)
    concepts = float(q[-ov.dim:] @ v[-ov.dim:])
    return {"score": shown, "ranker": shown - concepts, "concepts": concepts}


def shows_line(att) -> str | None:
    """One line: what the maps of ``att`` (with its ``parts``) split, against the score shown (None: the maps split
    that very score). The maps split the ranking model's part where their own score is it (the same weights), else
    they split the explaining model's own score, and the line says so."""
    p = att.parts
    if not p:
        return None
    same = abs(att.score - p["ranker"]) <= SAME_SCORE
    other = None if same else f"the maps split {att.model or 'the explaining model'}'s own score {att.score:.4f}"
    if p.get("concepts") is None:
        return other
    split = f"ranking model {p['ranker']:.4f}" + (" (the maps)" if same else "") + f" + concepts {p['concepts']:.4f}"
    return "; ".join(x for x in (split, other, NOT_DRAWN) if x)
