"""The relevance fitted to people's judgments: the probability that a person calls a photo a match for the query.

    python experiments/relevance_fit.py     # experiments/judgments/ -> experiments/results/open_vocab/relevance.json

Reads the judged pairs (experiments/judged_pairs.py: each pair's score is the one the search shows, the shipped
default's fused score) and the readers' ratings on Hodosh et al.'s 1-4 scale (experiments/judgments/ROUND/; the
README there gives both rounds' instructions). The fit uses round 2 (the scale in Hodosh et al.'s own words); round 1
(the same scale with the lead's glosses on what each point covers) is reported beside it. A pair is a match when its
readers' mean rating is at least 3. Increasing maps from score to the probability of a match (Platt's sigmoid, and
the isotonic map blended with it so that the map is strictly increasing and keeps the score's order) are
cross-fitted over five folds of the queries (a query's pairs together: each pair predicted by the map fitted on the
other four); the form with the lowest cross-fitted Brier score ships, refitted on every pair. "No photo matches this
well" is drawn at the highest probability under which at most LINE_MISS of the judged matches fall (chosen on the
fitting folds, reported on the held-out ones). The map it replaces (fitted to a caption's own photo among the 1,000
val photos: experiments/open_vocab.py relevance-own-photo) is measured on the same pairs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from vlmatch.io import write_json
from vlmatch_lab.host import cpu_flags, cpu_model

HERE = Path(__file__).resolve().parent
JUDGMENTS = HERE / "judgments"
ROUND = "round2"  # the judgments the relevance is fitted on
OTHER_ROUNDS = ("round1",)
RESULTS = HERE / "results" / "open_vocab"
FOLDS = 5
SEED = 66
LINE_MISS = 0.08  # the share of judged matches the "nothing matches" line may fall on (the goal allows 10 %)
KNOT_GRID = np.round(np.arange(-1.5, 1.5001, 0.025), 3)  # the shipped map's knots (scores), read by interpolation
FORMS = ("platt", "blend 0.1", "blend 0.25", "blend 0.5")  # the candidates: strictly increasing maps
REFERENCE = ("isotonic",)  # reported beside them: it ties the scores of each flat step


def read_ratings(round_: str = ROUND) -> dict[str, dict[str, int]]:
    """{reader: {pair id: rating}} from a round's ratings_*.jsonl (one JSON object a line: pair, rating)."""
    out = {}
    for path in sorted((JUDGMENTS / round_).glob("ratings_*.jsonl")):
        reader = path.stem.removeprefix("ratings_")
        got = {}
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            if r["pair"] in got or r["rating"] not in (1, 2, 3, 4):
                raise SystemExit(f"{path}:{n}: a repeated pair or a rating outside 1-4: {line}")
            got[r["pair"]] = int(r["rating"])
        out[reader] = got
    return out


def quadratic_kappa(a: np.ndarray, b: np.ndarray, k: int = 4) -> float:
    """Cohen's kappa with quadratic weights on ratings 1..k."""
    o = np.zeros((k, k))
    for x, y in zip(a, b, strict=True):
        o[x - 1, y - 1] += 1
    e = np.outer(o.sum(1), o.sum(0)) / o.sum()
    w = np.array([[(i - j) ** 2 for j in range(k)] for i in range(k)]) / (k - 1) ** 2
    return float(1 - (w * o).sum() / (w * e).sum())


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    po = float(np.mean(a == b))
    pe = float(np.mean(a) * np.mean(b) + np.mean(~a) * np.mean(~b))
    return (po - pe) / (1 - pe)


def agreement(ratings: dict[str, dict[str, int]]) -> list[dict]:
    out = []
    for r1, r2 in itertools.combinations(sorted(ratings), 2):
        both = sorted(set(ratings[r1]) & set(ratings[r2]))
        if not both:
            continue
        a = np.array([ratings[r1][p] for p in both])
        b = np.array([ratings[r2][p] for p in both])
        out.append({"readers": [r1, r2], "pairs": len(both), "exact": round(float(np.mean(a == b)), 4),
                    "within_one": round(float(np.mean(abs(a - b) <= 1)), 4),
                    "kappa_quadratic": round(quadratic_kappa(a, b), 4),
                    "match_agreement": round(float(np.mean((a >= 3) == (b >= 3))), 4),
                    "match_kappa": round(cohen_kappa(a >= 3, b >= 3), 4)})
    return out


def platt_fit(x: np.ndarray, y: np.ndarray, iters: int = 100) -> tuple[float, float]:
    """Logistic regression of y on x by Newton's method: P(match | x) = sigmoid(a x + b)."""
    X = np.stack([x, np.ones_like(x)], 1)
    theta = np.zeros(2)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(X @ theta)))
        H = (X * (p * (1 - p))[:, None]).T @ X + 1e-9 * np.eye(2)
        step = np.linalg.solve(H, X.T @ (p - y))
        theta -= step
        if np.abs(step).max() < 1e-12:
            break
    return float(theta[0]), float(theta[1])


def isotonic_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators on the pairs sorted by score: knots (each block's mean score, its rate)."""
    order = np.argsort(x, kind="stable")
    vals, wts, xs = [], [], []
    for v, xx in zip(y[order], x[order], strict=True):
        vals.append(float(v))
        wts.append(1.0)
        xs.append(float(xx))
        while len(vals) > 1 and vals[-2] >= vals[-1]:
            w = wts[-2] + wts[-1]
            vals[-2] = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w
            xs[-2] = (xs[-2] * wts[-2] + xs[-1] * wts[-1]) / w
            wts[-2] = w
            del vals[-1], wts[-1], xs[-1]
    return np.array(xs), np.array(vals)


def fit(form: str, x: np.ndarray, y: np.ndarray):
    """A function score -> probability of the given form, fitted on (x, y): "platt", "isotonic" or "blend D" (the
    isotonic map mixed with Platt's sigmoid at weight D: strictly increasing, so it keeps the score's order where the
    isotonic map alone ties every score of a flat step, and as calibrated as the isotonic map where D is small)."""
    a, b = platt_fit(x, y)
    platt = lambda s: 1 / (1 + np.exp(-(a * np.asarray(s) + b)))  # noqa: E731
    if form == "platt":
        return platt
    kx, ky = isotonic_fit(x, y)
    iso = lambda s: np.interp(np.asarray(s), kx, ky)  # noqa: E731
    if form == "isotonic":
        return iso
    d = float(form.split()[1])
    return lambda s: (1 - d) * iso(s) + d * platt(s)


def ece(p: np.ndarray, y: np.ndarray) -> tuple[float, list[dict]]:
    """Expected calibration error over ten bins of width 0.1, and the reliability curve."""
    bins, total = [], 0.0
    for lo in np.arange(0, 1, 0.1):
        m = (p >= lo) & ((p < lo + 0.1) if lo < 0.85 else (p <= 1))
        if m.any():
            gap = float(p[m].mean() - y[m].mean())
            total += m.sum() * abs(gap)
            bins.append({"range": [round(float(lo), 1), round(float(lo) + 0.1, 1)], "pairs": int(m.sum()),
                         "predicted": round(float(p[m].mean()), 4), "observed": round(float(y[m].mean()), 4)})
    return total / len(p), bins


def auc(p: np.ndarray, y: np.ndarray) -> float:
    pos, neg = p[y], p[~y]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def line_at(p: np.ndarray, y: np.ndarray) -> float:
    """The highest probability at which at most LINE_MISS of the matches fall under the line (on a 0.005 grid)."""
    grid = np.round(np.arange(0.005, 1.0, 0.005), 3)
    ok = [t for t in grid if np.mean(p[y] < t) <= LINE_MISS]
    return float(max(ok)) if ok else 0.0


# each sampled rank stands for the ranks up to the next one sampled (the random pick: every rank from 100 to 1,000),
# so that weighting a pair by its span gives each query's whole ranking over the 1,000 val photos
SPAN = {1: 1, 2: 2, 4: 4, 10: 13, 30: 79}
RANDOM_SPAN = 901


def gallery_weights(pairs: list[dict]) -> np.ndarray:
    return np.array([SPAN.get(pr["rank"], RANDOM_SPAN) if pr["rank"] < 100 else RANDOM_SPAN for pr in pairs], float)


def weighted_line_rates(p: np.ndarray, y: np.ndarray, clear_no: np.ndarray, t, w: np.ndarray) -> dict:
    """The line's rates over each query's whole ranking (pairs weighted by the ranks they stand for)."""
    under = p < t
    return {"matches_under": round(float(np.average(under[y], weights=w[y])), 4),
            "clear_non_matches_under": round(float(np.average(under[clear_no], weights=w[clear_no])), 4)}


def line_rates(p: np.ndarray, y: np.ndarray, clear_no: np.ndarray, t: float) -> dict:
    return {"matches_under": round(float(np.mean(p[y] < t)), 4),
            "clear_non_matches_under": round(float(np.mean(p[clear_no] < t)), 4)}


def measures(p: np.ndarray, y: np.ndarray, clear_no: np.ndarray, t: float) -> dict:
    e, bins = ece(p, y)
    big = [b for b in bins if b["pairs"] >= 50]
    return {"ece": round(e, 4), "brier": round(float(np.mean((p - y) ** 2)), 6), "auc": round(auc(p, y), 4),
            "worst_bin_of_50": round(max((abs(b["predicted"] - b["observed"]) for b in big), default=0.0), 4),
            "line": t, **line_rates(p, y, clear_no, t), "reliability": bins}


def top_photos(pairs: list[dict], y: np.ndarray) -> tuple[list[int], list[int]]:
    """The pair index of each query's top photo, split: queries whose top photo is a judged match, and queries none
    of whose judged top results (ranks 1, 2, 4) is (queries with a match at rank 2 or 4 only are in neither)."""
    by_q: dict[int, list[int]] = {}
    for i, pr in enumerate(pairs):
        by_q.setdefault(pr["query"], []).append(i)
    matched, unmatched = [], []
    for idx in by_q.values():
        top = next(i for i in idx if pairs[i]["rank"] == 1)
        if y[top]:
            matched.append(top)
        elif not any(y[i] for i in idx if pairs[i]["rank"] <= 4):
            unmatched.append(top)
    return matched, unmatched


def query_lines(pairs: list[dict], p: np.ndarray, y: np.ndarray, t: np.ndarray) -> dict:
    """Per query: the line should not fire where the top result is a judged match and should where none of the
    query's judged top results (ranks 1, 2, 4) is."""
    matched, unmatched = top_photos(pairs, y)
    return {"queries_top_match": len(matched), "line_on_them": int(sum(p[i] < t[i] for i in matched)),
            "queries_no_match_in_top4": len(unmatched), "line_missing_on_them": int(sum(p[i] >= t[i] for i in unmatched))}


def query_folds(pairs: list[dict]) -> np.ndarray:
    """Each pair's fold: the queries dealt at random (seed SEED) into FOLDS folds, a query's pairs together."""
    qs = np.array([pr["query"] for pr in pairs])
    uq = np.unique(qs)
    fold_of_q = dict(zip(uq, np.random.default_rng(SEED).permutation(len(uq)) % FOLDS, strict=True))
    return np.array([fold_of_q[q] for q in qs])


def labels(pairs: list[dict], ratings: dict[str, dict[str, int]]) -> tuple[list[dict], np.ndarray]:
    """The pairs at least two readers judged, and each one's mean rating."""
    judged = [pr for pr in pairs if sum(pr["pair"] in r for r in ratings.values()) >= 2]
    if len(judged) < len(pairs):
        print(f"note: {len(pairs) - len(judged)} of {len(pairs)} pairs have fewer than two readers; left out")
    return judged, np.array([np.mean([r[pr["pair"]] for r in ratings.values() if pr["pair"] in r]) for pr in judged])


def readers_summary(ratings: dict[str, dict[str, int]], mean: np.ndarray) -> dict:
    return {"readers": sorted(ratings), "matches": int((mean >= 3).sum()), "clear_non_matches": int((mean <= 1.5).sum()),
            "rating_counts": {str(k): int(sum(v == k for r in ratings.values() for v in r.values())) for k in (1, 2, 3, 4)},
            "agreement": agreement(ratings)}


def cross_fit(x: np.ndarray, y: np.ndarray, clear_no: np.ndarray, fold: np.ndarray) -> tuple[dict, dict, dict]:
    """Each form's figures with every pair predicted by the map fitted on the other folds (and the line chosen there)."""
    cross, lines, preds = {}, {}, {}
    for form in FORMS + REFERENCE:
        p, t_fold = np.empty_like(x), np.empty_like(x)
        for f in range(FOLDS):
            tr, te = fold != f, fold == f
            m = fit(form, x[tr], y[tr].astype(np.float64))
            p[te] = m(x[te])
            t_fold[te] = line_at(m(x[tr]), y[tr])
        e = measures(p, y, clear_no, float("nan"))
        under = p < t_fold
        e.update({"line": "chosen on the fitting folds", "matches_under": round(float(np.mean(under[y])), 4),
                  "clear_non_matches_under": round(float(np.mean(under[clear_no])), 4)})
        cross[form], lines[form], preds[form] = e, t_fold, p
    return cross, lines, preds


def shipped_map(form: str, x: np.ndarray, y: np.ndarray):
    """The chosen form refitted on every pair, as the registry's knots (read by linear interpolation), and its line."""
    model = fit(form, x, y.astype(np.float64))
    knots = np.unique(np.concatenate([KNOT_GRID, np.round(isotonic_fit(x, y.astype(np.float64))[0], 5)]))
    probs = np.round(model(knots), 10)
    keep = np.concatenate([[True], np.diff(probs) > 0])  # far out, the sigmoid's tail rounds to equal values
    t = line_at(model(x), y)
    return model, {"scores": [float(v) for v in knots[keep]], "probabilities": [float(v) for v in probs[keep]],
                   "threshold": t}


def main() -> None:
    from vlmatch.search.open_vocab import Relevance

    d = json.loads((JUDGMENTS / "pairs.json").read_text())
    ratings = read_ratings(ROUND)
    pairs, mean = labels(d["pairs"], ratings)
    x = np.array([pr["score"] for pr in pairs], dtype=np.float64)
    y, clear_no = mean >= 3, mean <= 1.5
    fold = query_folds(pairs)
    cross, lines, preds = cross_fit(x, y, clear_no, fold)
    form = min(FORMS, key=lambda f: cross[f]["brier"])
    model, shipped = shipped_map(form, x, y)
    t = shipped["threshold"]
    p_all = model(x)
    old = Relevance.of(json.loads((RESULTS / "relevance_own_photo.json").read_text())["shipped"])
    p_old = old(x)
    rounds = {}
    for other in OTHER_ROUNDS:  # the other rounds' labels: how far the shipped map depends on the instructions
        r_o = read_ratings(other)
        pairs_o, mean_o = labels(d["pairs"], r_o)
        mine = {pr["pair"]: m for pr, m in zip(pairs, mean, strict=True)}
        both = [(mine[pr["pair"]], m, pr["score"]) for pr, m in zip(pairs_o, mean_o, strict=True) if pr["pair"] in mine]
        a, b, xs = (np.array(v) for v in zip(*both, strict=True))
        rounds[other] = {**readers_summary(r_o, mean_o),
                         "match_agreement_with_" + ROUND: round(float(np.mean((a >= 3) == (b >= 3))), 4),
                         "shipped_map_on_its_labels": {k: v for k, v in measures(model(xs), b >= 3, b <= 1.5, t).items()
                                                       if k != "reliability"}}
    out = {
        "what": " ".join(__doc__.split("\n\n")[2].split()),
        "command": "python experiments/relevance_fit.py",
        "round": ROUND, "pairs": len(pairs), "queries": len({pr["query"] for pr in pairs}), **readers_summary(ratings, mean),
        "by_kind": {k: {"pairs": int(sum(pr["kind"] == k for pr in pairs)),
                        "matches": int(sum(y[i] for i, pr in enumerate(pairs) if pr["kind"] == k))}
                    for k in ("val caption", "everyday")},
        "cross_fitted": cross, "form": form,
        "selected": {"what": "the relevance's form", "among": list(FORMS),
                     "by": "cross-fitted Brier score on the judged pairs", "cross_fitted": True},
        "line_miss": LINE_MISS,
        "shipped": shipped,
        "in_sample": measures(p_all, y, clear_no, t),
        "gallery_weighted": {"what": "the line's rates over each query's whole ranking of the 1,000 val photos: a "
                             "pair weighted by the ranks its sampled rank stands for (1, 2-3, 4-7, 8-20, 21-99, "
                             "100-1,000)",
                             "cross_fitted": weighted_line_rates(preds[form], y, clear_no, lines[form],
                                                                 gallery_weights(pairs)),
                             "before": weighted_line_rates(p_old, y, clear_no, old.threshold, gallery_weights(pairs))},
        "query_lines": {"cross_fitted": query_lines(pairs, preds[form], y, lines[form]),
                        "in_sample": query_lines(pairs, p_all, y, np.full_like(x, t))},
        "before": {"what": "the map fitted to a caption's own photo among the 1,000 val photos, on the same pairs",
                   **measures(p_old, y, clear_no, old.threshold),
                   "query_lines": query_lines(pairs, p_old, y, np.full_like(x, old.threshold))},
        "other_rounds": rounds,
        "host": {"cpu": cpu_model(), "flags": cpu_flags()},
    }
    write_json(RESULTS / "relevance.json", out)
    keys = ("ece", "brier", "auc", "worst_bin_of_50", "matches_under", "clear_non_matches_under")
    print(json.dumps({"agreement": out["agreement"], "form": form, "threshold": t,
                      "before": {k: out["before"].get(k) for k in keys},
                      **{f"cross_fitted {f}": {k: cross[f][k] for k in keys} for f in cross},
                      "other_rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
