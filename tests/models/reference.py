"""Plain, loop-by-loop implementations of the papers' equations, one pair at a time, in float64.

Deliberately naive: every sum is written over explicit indices so the vectorised models can be
checked against the equations as printed.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-8


def cos(a, b):
    return float(a @ b) / max(float(a.norm()) * float(b.norm()), EPS)


def _leaky(x):
    return x if x > 0 else 0.1 * x


def _norm_list(vals, kind):
    """SCAN raw_feature_norm over one query axis (a list of floats)."""
    if kind == "softmax":
        m = max(vals)
        ex = [math.exp(x - m) for x in vals]
        return [x / sum(ex) for x in ex]
    if kind.startswith("clipped"):
        vals = [_leaky(x) for x in vals]
    if kind.endswith("l2norm"):
        n = math.sqrt(sum(x * x for x in vals)) + EPS
        return [x / n for x in vals]
    if kind.endswith("l1norm"):
        n = sum(abs(x) for x in vals) + EPS
        return [x / n for x in vals]
    return vals


def _softmax(vals, lam):
    m = max(lam * x for x in vals)
    ex = [math.exp(lam * x - m) for x in vals]
    return [x / sum(ex) for x in ex]


def _pool(rel, how, lam2):
    if how == "avg":
        return sum(rel) / len(rel)
    if how == "sum":
        return sum(rel)
    if how == "max":
        return max(rel)
    return math.log(sum(math.exp(lam2 * r) for r in rel)) / lam2


def scan_pair(v, e, direction, norm, lam1, agg, lam2):
    """SCAN score of one pair. v: (k, D) valid regions; e: (n, D) valid words."""
    v, e = v.double(), e.double()
    k, n = len(v), len(e)
    s = [[float(v[i] @ e[j]) for j in range(n)] for i in range(k)]
    rel = []
    if direction == "t2i":
        s_bar_rows = [_norm_list(s[i], norm) for i in range(k)]  # normalised along words
        for j in range(n):
            alpha = _softmax([s_bar_rows[i][j] for i in range(k)], lam1)
            a = sum(alpha[i] * v[i] for i in range(k))
            rel.append(cos(e[j], a))
    else:
        s_bar_cols = [_norm_list([s[i][j] for i in range(k)], norm) for j in range(n)]  # along regions
        for i in range(k):
            alpha = _softmax([s_bar_cols[j][i] for j in range(n)], lam1)
            a = sum(alpha[j] * e[j] for j in range(n))
            rel.append(cos(v[i], a))
    return _pool(rel, agg, lam2)


def summax_pair(v, e, direction):
    v, e = v.double(), e.double()
    s = [[float(v[i] @ e[j]) for j in range(len(e))] for i in range(len(v))]
    if direction == "t2i":
        return sum(max(s[i][j] for i in range(len(v))) for j in range(len(e)))
    return sum(max(s[i][j] for j in range(len(e))) for i in range(len(v)))


def score_matrix(pair_fn, img, txt):
    """Fill (n_img, n_txt) by calling ``pair_fn(v_valid, e_valid)`` for each pair."""
    n_img, n_txt = len(img.regions), len(txt.lengths)
    out = torch.zeros(n_img, n_txt, dtype=torch.float64)
    for a in range(n_img):
        v = img.regions[a] if img.mask is None else img.regions[a][img.mask[a]]
        for b in range(n_txt):
            out[a, b] = pair_fn(v, txt.words[b, : int(txt.lengths[b])])
    return out
