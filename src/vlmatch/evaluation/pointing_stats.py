"""Noise and selection for pointing figures: a bootstrap interval over images, and a cross-fitted choice.

Phrases of one photo are not independent (the same map, often the same person), so the interval resamples
**images** with their phrases (a cluster bootstrap), from the per-image counts the pointing game records
(``per_image``: names, hits, phrases). A choice made by val pointing among several runs (a loss weight, a
form) flatters the chosen run on the same phrases; :func:`crossfit_choice` picks on one half of the images
and reports on the other, both ways, so the figure of "the run we would pick" carries no selection bias.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _counts(result: dict) -> tuple[list[str], np.ndarray, np.ndarray]:
    per = result.get("per_image")
    if not per:
        raise ValueError(f"result {result.get('row') or result.get('model')!r} has no per_image counts "
                         f"(run the pointing game again: older result files lack them)")
    return list(per["names"]), np.asarray(per["hits"], dtype=np.int64), np.asarray(per["phrases"], dtype=np.int64)


def bootstrap_interval(result: dict, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """``level`` percentile interval (in %) of the pointing accuracy, images resampled with their phrases."""
    _, hits, phrases = _counts(result)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(hits), size=(n_boot, len(hits)))
    acc = 100.0 * hits[draws].sum(axis=1) / np.maximum(phrases[draws].sum(axis=1), 1)
    lo, hi = np.percentile(acc, [50 * (1 - level), 50 * (1 + level)])
    return round(float(lo), 2), round(float(hi), 2)


def half_of(name: str) -> int:
    """0 or 1: a fixed split of images by a hash of the name (the same halves for every run and host)."""
    return hashlib.sha256(name.encode()).digest()[0] & 1


def _pointing(hits: np.ndarray, phrases: np.ndarray, keep: np.ndarray) -> float:
    return 100.0 * float(hits[keep].sum()) / max(int(phrases[keep].sum()), 1)


def crossfit_choice(results: dict[str, dict], score=None) -> dict:
    """Pick the best of ``results`` (name -> pointing result) on one half of the images, report it on the other
    half, both ways; the cross-fitted figure is the phrase-weighted mean of the two reports.

    ``score(name, half_pointing) -> float`` ranks the candidates on the picking half (default: pointing alone;
    pass one that also weighs rsum for a joint choice). Every result must cover the same images."""
    names = None
    counts = {}
    for key, r in results.items():
        n, h, p = _counts(r)
        if names is None:
            names = n
        elif n != names:
            raise ValueError(f"results {key!r} and {next(iter(results))!r} cover different images")
        counts[key] = (h, p)
    halves = np.array([half_of(n) for n in names])
    rank = score or (lambda _name, acc: acc)
    out = {"halves": [int((halves == 0).sum()), int((halves == 1).sum())], "picks": {}}
    hit_sum = phrase_sum = 0
    for pick_on in (0, 1):
        pick_mask, report_mask = halves == pick_on, halves != pick_on
        best = max(results, key=lambda k: rank(k, _pointing(*counts[k], pick_mask)))
        h, p = counts[best]
        out["picks"][f"picked_on_{pick_on}"] = {"run": best, "reported_on_other": round(_pointing(h, p, report_mask), 2)}
        hit_sum += int(h[report_mask].sum())
        phrase_sum += int(p[report_mask].sum())
    out["pointing"] = round(100.0 * hit_sum / max(phrase_sum, 1), 2)
    best_full = max(results, key=lambda k: rank(k, _pointing(*counts[k], np.ones(len(names), bool))))
    out["chosen_on_all"] = {"run": best_full, "pointing": results[best_full]["pointing"]}
    return out
