"""Near-identical photos (``vlmatch index duplicates``): issue 46, item 6."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from vlmatch.cli import main
from vlmatch.errors import ConfigError
from vlmatch.search.index import Index
from vlmatch.search.library.duplicates import find_duplicates, group_pairs, similar_pairs
from vlmatch.search.library.similar import image_query

from ..like_index import like_index  # noqa: F401 -- the fixture


def test_group_pairs_joins_chains_and_drops_singletons():
    assert group_pairs(7, [(5, 1), (1, 3), (6, 4)]) == [[1, 3, 5], [4, 6]]
    assert group_pairs(3, []) == []
    assert group_pairs(4, [(0, 1), (1, 2), (2, 3), (3, 0)]) == [[0, 1, 2, 3]]


def _components(sim: np.ndarray, t: float) -> list[list[int]]:
    """Brute force: connected components (>= 2 members) of the graph sim >= t, by repeated flooding."""
    n, seen, out = len(sim), set(), []
    for s in range(n):
        if s in seen:
            continue
        comp, todo = {s}, [s]
        while todo:
            i = todo.pop()
            for j in range(n):
                if j != i and j not in comp and sim[i, j] >= t:
                    comp.add(j)
                    todo.append(j)
        seen |= comp
        if len(comp) > 1:
            out.append(sorted(comp))
    return sorted(out)


@pytest.mark.parametrize("threshold", [0.2, 0.5, 0.8])
def test_similar_pairs_and_groups_match_brute_force(threshold):
    rng = np.random.default_rng(0)
    base = rng.normal(size=(12, 8))
    x = np.concatenate([base, base[:4] + 0.3 * rng.normal(size=(4, 8))])  # 4 near copies
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    sim = x @ x.T
    pairs = similar_pairs(x, x, threshold, neighbours=len(x))
    want = {(i, j) for i, j in itertools.combinations(range(len(x)), 2) if sim[i, j] >= threshold}
    assert {(i, j) for i, j, _ in pairs} == want
    assert all(s == pytest.approx(sim[i, j], abs=1e-5) for i, j, s in pairs)
    assert group_pairs(len(x), [(i, j) for i, j, _ in pairs]) == _components(sim, threshold)


def _family_threshold(idx: Index) -> tuple[float, set[str]]:
    """The lowest similarity of photo_000 to its two copies (so at that threshold they must be one group)."""
    vec = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    names = [Path(it["path"]).name for it in idx.items]
    q = image_query(idx, vec)
    fam = {"photo_000.jpg", "copy_small.jpg", "copy_q40.jpg"}
    rows = [names.index(n) for n in fam]
    return float(min(q[a] @ vec[b] for a in rows for b in rows if a != b)) - 1e-4, fam


def test_find_duplicates_groups_the_copies_as_brute_force_does(like_index):  # noqa: F811
    idx = Index.open(like_index, lean_queries=False)
    t, fam = _family_threshold(idx)
    rep = find_duplicates(idx, t, copies=False)  # similarity alone: the components of the graph sim >= t
    groups = [{Path(p).name for p in g["paths"]} for g in rep["groups"]]
    assert any(fam <= g for g in groups)
    vec = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    sim = image_query(idx, vec) @ vec.T
    by_row = {it["id"]: r for r, it in enumerate(idx.items)}
    assert sorted(sorted(by_row[i] for i in g["ids"]) for g in rep["groups"]) == _components(sim, t)
    for g in rep["groups"]:
        assert t <= g["similarity"] <= 1.0 + 1e-5
    assert rep["photos"] == len(idx)
    # a threshold above every pair: no groups
    assert find_duplicates(idx, 1.0, copies=False)["groups"] == []


def test_cli_duplicates_table_and_json(like_index, tmp_path, capsys):  # noqa: F811
    idx = Index.open(like_index, lean_queries=False)
    t, fam = _family_threshold(idx)
    out = tmp_path / "dups.json"
    assert main(["index", "duplicates", str(like_index), "--threshold", f"{t:.6f}", "--similar", "--json",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    assert "copy_small.jpg" in printed and "groups," in printed
    rec = json.loads(out.read_text())
    assert rec["threshold"] == pytest.approx(t, abs=1e-6) and rec["index"] == str(like_index)
    assert any(fam <= {Path(p).name for p in g["paths"]} for g in rec["groups"])


@pytest.mark.parametrize("args, message", [
    (["--threshold", "1.5"], "--threshold 1.5: a duplicate's similarity is above 0 and at most 1"),
    (["--threshold", "nan"], "--threshold nan: a duplicate's"),
    (["--threshold", "-1"], "--threshold -1.0: a duplicate's similarity is above 0"),
    (["--neighbours", "0"], "--neighbours must be at least 1"),
])
def test_cli_duplicates_errors_are_one_line(like_index, capsys, args, message):  # noqa: F811
    assert main(["index", "duplicates", str(like_index), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_duplicates_not_an_index(tmp_path, capsys):
    assert main(["index", "duplicates", str(tmp_path)]) == 2
    assert "not an index folder" in capsys.readouterr().err


def test_find_duplicates_refuses_a_bad_threshold(like_index):  # noqa: F811
    with pytest.raises(ConfigError):
        find_duplicates(Index.open(like_index, lean_queries=False), 2.0)


@pytest.mark.parametrize("threshold", [-1.0, 0.0, -0.5, 1.5, float("nan")])
def test_a_threshold_that_joins_everything_or_nothing_is_refused_in_one_line(threshold):
    from vlmatch.errors import ConfigError
    from vlmatch.search.library.duplicates import check_threshold

    with pytest.raises(ConfigError, match=r"--threshold .*: a duplicate's similarity is above 0 and at most 1") as e:
        check_threshold(threshold)
    assert "\n" not in str(e.value)


def test_the_range_error_names_the_default_the_registry_records(capsys):
    """The default it names is the shipped model's recorded threshold, read from the registry (not a number typed
    into the message: it said "the default 0.68" after the default became the model's own)."""
    from vlmatch import pretrained
    from vlmatch.cli import main

    model, retriever = pretrained.default_pair()
    recorded = pretrained.get(retriever or model).duplicates["threshold"]
    assert main(["index", "duplicates", "no-index", "--threshold", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--threshold 1.5" in err
    assert f"the model's own ({recorded} for the shipped default model)" in err and "0.68" not in err


def test_the_default_threshold_is_the_models_own_and_its_figures_come_from_the_benchmark():
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from vlmatch import pretrained
    from vlmatch.search.library.duplicates import DEFAULT_THRESHOLD, model_threshold

    entry = pretrained.get("vsepp-lite2-320-grounded-f8k")
    rec = entry.duplicates
    results = json.loads((Path(__file__).resolve().parents[3] / rec["results"]).read_text())
    assert results["chosen"] == {k: rec[k] for k in ("threshold", "copy_bits", "strong_bits")}
    assert results["model"] == entry.name and rec["results"] == "benchmarks/results/duplicates_copies.json"
    assert rec["pair_precision"] >= 0.98 and rec["pair_recall"] >= 0.95  # the goal, held out
    assert round(results["half_b"]["pair_precision"], 3) == rec["pair_precision"]
    assert round(results["half_b"]["pair_recall"], 3) == rec["pair_recall"]
    shipped = SimpleNamespace(manifest={"model": {"sha256": entry.sha256}, "retriever": None})
    assert model_threshold(shipped) == (rec["threshold"], rec)
    own = SimpleNamespace(manifest={"model": {"sha256": "0" * 64}, "retriever": None})
    assert model_threshold(own) == (DEFAULT_THRESHOLD, None)  # a model that records none: the generic default


def test_threshold_help_says_what_it_is(capsys):
    from vlmatch.cli import main

    with pytest.raises(SystemExit):
        main(["index", "duplicates", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "cosine of the two photos' image embeddings" in help_text and "model's own threshold" in help_text


def test_with_the_copy_signal_the_copies_are_grouped_and_the_other_photos_are_not(like_index):  # noqa: F811
    idx = Index.open(like_index, lean_queries=False)
    assert all(it.get("copy_hash") for it in idx.items)  # the build stored each photo's signal
    t, fam = _family_threshold(idx)
    low = min(t, 0.1)  # similarity alone at this threshold groups the drawn scenes, which are not copies
    rep = find_duplicates(idx, low)
    groups = [{Path(p).name for p in g["paths"]} for g in rep["groups"]]
    assert fam in groups and {"photo_001.jpg", "photo_001_rot.jpg"} in groups and len(groups) == 2, groups
    assert rep["copy_signal"]["copy_bits"] >= 1 and rep["without_copy_signal"] == 0


def _rows(*hashes, flat=(), sha=None):
    return [{"copy_hash": h, **({"copy_flat": True} if i in flat else {}), "sha256": (sha or {}).get(i, f"s{i}")}
            for i, h in enumerate(hashes)]


def test_copy_filter_needs_both_signals_to_agree_or_a_very_close_signal_alone():
    from vlmatch.search.library.duplicates import copy_filter

    a, near, mid, far = "7a3c5e91d2b4f608", "7a3c5e91d2b4f609", "7a3c5e91d2b4f0f7", "0123456789abcdef"
    rows = _rows(a, near, far, mid)  # near: 1 bit from a; mid: 10 bits; far: many
    kept, missing = copy_filter([(0, 1, 0.9), (0, 2, 0.99), (1, 2, 0.95)], rows, 0.7, copy_bits=10, strong_bits=2)
    assert kept == [(0, 1, 0.9)] and missing == 0  # far is a look-alike: similar, but not the same photo
    assert copy_filter([(0, 1, 0.1)], rows, 0.7, 10, 2)[0] == [(0, 1, 0.1)]  # very close bits alone: a turned copy
    assert copy_filter([(0, 3, 0.6)], rows, 0.7, 10, 2)[0] == []  # 10 bits: only with the similarity
    assert copy_filter([(0, 3, 0.75)], rows, 0.7, 10, 2)[0] == [(0, 3, 0.75)]


def test_near_pairs_finds_every_pair_within_the_bits_as_brute_force_does():
    from vlmatch.features.copyhash import distances, hash_table, near_pairs

    rng = np.random.default_rng(0)
    base = [int(x) for x in rng.integers(0, 2 ** 63, 30, dtype=np.int64)]
    flips = [b ^ (1 << int(rng.integers(0, 63))) ^ (1 << int(rng.integers(0, 63))) for b in base[:10]]
    hashes = [f"{h:016x}" for h in base + flips]
    table = hash_table(hashes)
    i, j = np.triu_indices(len(hashes), 1)
    d = distances(table, i, j)
    want = {(int(a), int(b)) for a, b, x in zip(i, j, d, strict=True) if x <= 2}
    assert len(want) >= 10 and {(a, b) for a, b, _ in near_pairs(hashes, 2)} == want
    assert all(a not in (0, 30) and b not in (0, 30) for a, b, _ in near_pairs(hashes, 2, skip=[0, 30]))


def test_near_blank_photos_group_only_with_a_byte_identical_file():
    from vlmatch.search.library.duplicates import copy_filter

    flat = "462928d629c6d629"
    rows = _rows(flat, flat, flat, "7a3c5e91d2b4f608", flat=(0, 1, 2), sha={0: "x", 1: "x", 2: "y"})
    kept, _ = copy_filter([(0, 1, 0.99), (0, 2, 0.99), (2, 3, 0.99)], rows, 0.7, 20, 20)
    assert kept == [(0, 1, 0.99)]


def test_photos_of_an_index_built_before_the_signal_are_grouped_by_similarity_and_counted():
    from vlmatch.search.library.duplicates import copy_filter

    rows = [{"sha256": "a"}, {"sha256": "b"}, {"copy_hash": "7a3c5e91d2b4f608"}]
    kept, missing = copy_filter([(0, 1, 0.8), (0, 2, 0.6)], rows, 0.7, 10, 2)
    assert kept == [(0, 1, 0.8)] and missing == 2


def test_cli_says_which_rule_grouped_the_photos(like_index, capsys):  # noqa: F811
    assert main(["index", "duplicates", str(like_index)]) == 0
    out = capsys.readouterr().out
    assert "copies: the copy signals at most" in out and "no copy signal" not in out
