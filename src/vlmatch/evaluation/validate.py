"""Validation: the metrics that choose a training run's best checkpoint, on the validation split.

A model declares how its checkpoints are chosen (:meth:`MatchingModel.checkpoint_selection`, a
:class:`vlmatch.models.base.Selection`); this module runs what it declares, so models never call the engine
that evaluates them.
"""

from __future__ import annotations

from .. import distributed as D
from .metrics import evaluate_protocol, recall_metrics
from .rerank import evaluate_reranked, model_text_neighbors
from .scoring import model_scores, two_stage_scores


def selection_metrics(model, split, device, progress: bool = False, compile: bool = False) -> dict | None:  # noqa: A002
    """The metrics ``model.checkpoint_selection()`` asks for on ``split``. Under torchrun every rank calls
    it and scores its share of the matrix; rank 0 returns the metrics, the others None. ``compile``: the
    engine's compiled scoring (``model_scores(compile=True)``: one block shape, equal to float rounding)."""
    selection = model.checkpoint_selection()
    sims = model_scores(model, split, device=device, progress=progress, compile=compile)
    if sims is None:  # a torchrun rank other than 0: it scored its share, rank 0 evaluates
        return None
    if selection.kind == "recall":
        return evaluate_protocol(sims, "single", source=split.captions_path)
    nb = model_text_neighbors(model, split, selection.k_text, device=device, progress=progress)
    res = evaluate_reranked(sims, "single", k=selection.k, k_text=selection.k_text, neighbors=nb,
                            source=split.captions_path)
    return {**res["after"], "reranked": {"k": res["k"], "k_text": res["k_text"], "before_rsum": res["before"]["rsum"]}}


def validate(model, split, device, progress=False, top_k: int = 0, compile: bool = False) -> dict | None:  # noqa: A002
    """Recall on ``split``: what the model's checkpoint selection declares (exhaustive matrix), or with
    ``top_k`` two-stage retrieval (rank by the model's global part, re-score each query's top K;
    :func:`vlmatch.evaluation.scoring.two_stage_scores`). Under torchrun every rank must call it: for the
    exhaustive matrix each rank scores its share of the image blocks and rank 0 evaluates; two-stage
    validation runs on rank 0 alone. Rank 0 returns the metrics, the others None. ``compile``: the exhaustive
    matrix through the engine's compiled scoring (``train.compile``)."""
    if top_k:
        if D.world()[0] != 0:
            return None
        i2t, t2i = two_stage_scores(model, split, top_k, device=device, progress=progress)
        return {"protocol": f"single, two-stage top {top_k}", "n_images": i2t.shape[0], "n_captions": i2t.shape[1],
                **recall_metrics(i2t, t2i)}
    return selection_metrics(model, split, device, progress=progress, compile=compile)
