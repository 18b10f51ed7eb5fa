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
    rep = find_duplicates(idx, t)
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
    assert find_duplicates(idx, 1.0)["groups"] == []


def test_cli_duplicates_table_and_json(like_index, tmp_path, capsys):  # noqa: F811
    idx = Index.open(like_index, lean_queries=False)
    t, fam = _family_threshold(idx)
    out = tmp_path / "dups.json"
    assert main(["index", "duplicates", str(like_index), "--threshold", f"{t:.6f}", "--json", str(out)]) == 0
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
    assert results["threshold"] == rec["threshold"] and results["model"] == entry.name
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
