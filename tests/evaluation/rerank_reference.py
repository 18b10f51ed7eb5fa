# ruff: noqa: E741
"""Plain loops over MTFN-RR's re-ranking equations (eq. 8-15), one query at a time, as printed.

Rankings are stable descending sorts (ties: lower index first); G(T, K') = {T} + the K' nearest other
captions by S_TT(T, .); equal p keeps the original order (the decisions documented in vlmatch.evaluation.rerank).
"""

from __future__ import annotations


def ranking(scores) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))


def loop_i2t(S, K):
    """For every image: its re-ranked list of all captions."""
    n_img, n_cap = S.shape
    lists = []
    for I in range(n_img):
        R = ranking(S[I])  # eq. 8 (first K)
        cands = R[:K]
        P = []
        for T in cands:
            R_T = ranking(S[:, T])  # eq. 9: T's ranking of all N images
            P.append(R_T.index(I))  # eq. 10: p(T) = k with I_k = I
        reranked = [T for _, T in sorted(zip(P, cands, strict=True), key=lambda x: x[0])]  # eq. 11-12, stable
        lists.append(reranked + R[K:])
    return lists


def neighbours(STT, T, Kp):
    others = [t for t in ranking(STT[T]) if t != T]
    return {T, *others[:Kp]}


def loop_t2i(S, K, STT=None, Kp=0):
    """For every caption: its re-ranked list of all images."""
    n_img, n_cap = S.shape
    G = [neighbours(STT, t, Kp) if STT is not None else {t} for t in range(n_cap)]  # eq. 14
    lists = []
    for T in range(n_cap):
        R = ranking(S[:, T])  # eq. 13
        cands = R[:K]
        P = []
        for I in cands:
            R_I = ranking(S[I])  # eq. 15: I's ranking of all captions
            P.append(next(k for k, Tk in enumerate(R_I) if T in G[Tk]))
        reranked = [I for _, I in sorted(zip(P, cands, strict=True), key=lambda x: x[0])]
        lists.append(reranked + R[K:])
    return lists
