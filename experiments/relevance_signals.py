"""Can another signal tell a near miss from a match? The judged pairs scored by the signals a "nothing matches" line
could be drawn on, each fitted and measured exactly as the shipped relevance is (experiments/relevance_fit.py).

    python experiments/relevance_signals.py --index VAL_INDEX    # -> experiments/results/open_vocab/relevance_signals.json

VAL_INDEX: an index of the 1,000 Flickr8k val JPEGs built with the shipped default (the one the judged pairs were
sampled from; the script checks that every pair's score is the one it shows). The signals, for a query and a photo:

- ``fused``: the score the search shows (what the shipped relevance maps);
- ``query_centred``: that score standardised over the query's scores of all 1,000 photos (a query whose photos all
  score high is not thereby matched);
- ``weakest_word_ranker``: the query's weakest content word, each word searched alone and its score standardised
  over the 1,000 photos (a near miss lacks one named thing: "a building *at night*");
- ``weakest_word_concepts``: the same with each word's concept score (the AND re-scoring's evidence,
  :mod:`vlmatch.search.compose`).

Each is cross-fitted over the same five folds of queries with every increasing form, the line drawn as shipped; per
query, the top photo's signal separates queries whose top photo is a judged match from those whose ranks 1, 2 and 4
hold none (AUC; 0.5 is chance)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from relevance_fit import (
    FORMS,
    JUDGMENTS,
    RESULTS,
    ROUND,
    auc,
    cross_fit,
    labels,
    query_folds,
    query_lines,
    read_ratings,
    top_photos,
)

from vlmatch.io import write_json
from vlmatch_lab.host import cpu_flags, cpu_model

SIGNALS = ("fused", "query_centred", "weakest_word_ranker", "weakest_word_concepts")


def standardised(scores: np.ndarray) -> np.ndarray:
    """(photos, columns) -> each column standardised over the photos."""
    return (scores - scores.mean(0)) / (scores.std(0) + 1e-12)


def signal_table(index, pairs: list[dict], texts: list[str]) -> dict[str, np.ndarray]:
    """Each signal for each judged pair."""
    from vlmatch.search.compose import query_terms
    from vlmatch.search.open_vocab import content_words

    coll = index._need("images")
    names = [Path(it["path"]).name for it in coll.items]
    row = {n: i for i, n in enumerate(names)}
    n = len(names)

    def all_scores(queries: list[str]) -> np.ndarray:  # (photos, queries): the score the search shows
        out = np.empty((n, len(queries)))
        for j, hits in enumerate(index.search_many(queries, k=n, candidates=n)):
            for h in hits:
                out[row[Path(h.path).name], j] = h.score
        return out

    words_of = {t: query_terms(t, 6) or content_words(t) for t in texts}
    vocab = sorted({w for ws in words_of.values() for w in ws})
    col = {w: j for j, w in enumerate(vocab)}
    full = all_scores(texts)
    ranker_words = standardised(all_scores(vocab))
    ov = index.stage1_source.open_vocab
    concepts = coll.stage1_vectors(np.arange(n))[:, -ov.dim:]
    concept_words = standardised(concepts @ ov.text_vectors(vocab).float().numpy().T)
    z_full = standardised(full)
    out = {s: np.empty(len(pairs)) for s in SIGNALS}
    for i, pr in enumerate(pairs):
        r, q = row[pr["photo"]], pr["query"]
        if abs(full[r, q] - pr["score"]) > 1e-4:
            sys.exit(f"{index.root}: pair {pr['pair']} scores {full[r, q]:.5f} here, {pr['score']} when it was "
                     "sampled: not the index the judged pairs came from")
        cols = [col[w] for w in words_of[texts[q]]]
        out["fused"][i], out["query_centred"][i] = full[r, q], z_full[r, q]
        out["weakest_word_ranker"][i] = ranker_words[r, cols].min()
        out["weakest_word_concepts"][i] = concept_words[r, cols].min()
    return out


def top_photo_auc(pairs: list[dict], x: np.ndarray, y: np.ndarray) -> dict:
    """How well the top photo's signal separates queries whose top photo matches from those with no match in ranks
    1, 2 and 4."""
    matched, unmatched = top_photos(pairs, y)
    lab = np.array([True] * len(matched) + [False] * len(unmatched))
    return {"queries_top_match": len(matched), "queries_no_match_in_top4": len(unmatched),
            "auc": round(auc(x[matched + unmatched], lab), 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="an index of the 1,000 val JPEGs built with the shipped default")
    a = ap.parse_args(argv)
    from vlmatch.search import Index

    d = json.loads((JUDGMENTS / "pairs.json").read_text())
    pairs, mean = labels(d["pairs"], read_ratings(ROUND))
    y, clear_no = mean >= 3, mean <= 1.5
    fold = query_folds(pairs)
    signals = signal_table(Index.open(a.index), pairs, d["queries"])
    rows = {}
    for name, x in signals.items():
        cross, lines, preds = cross_fit(x, y, clear_no, fold)
        form = min(FORMS, key=lambda f: cross[f]["brier"])
        rows[name] = {"form": form, "pair_auc": round(auc(x, y), 4),
                      **{k: cross[form][k] for k in ("ece", "brier", "matches_under", "clear_non_matches_under")},
                      "query_lines": query_lines(pairs, preds[form], y, lines[form]),
                      "top_photo": top_photo_auc(pairs, x, y)}
    write_json(RESULTS / "relevance_signals.json",
               {"what": " ".join(__doc__.split("\n\n")[0].split()), "command": "python experiments/relevance_signals.py "
                "--index VAL_INDEX", "round": ROUND, "pairs": len(pairs), "signals": rows,
                "host": {"cpu": cpu_model(), "flags": cpu_flags()}})
    print("| signal | pair AUC | ECE | matches under | clear non-matches under | line missing on no-match queries "
          "| top-photo AUC |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        ql = r["query_lines"]
        print(f"| {name} | {r['pair_auc']:.3f} | {r['ece']:.3f} | {100 * r['matches_under']:.1f} % | "
              f"{100 * r['clear_non_matches_under']:.1f} % | {ql['line_missing_on_them']} of "
              f"{ql['queries_no_match_in_top4']} | {r['top_photo']['auc']:.3f} |")


if __name__ == "__main__":
    main()
