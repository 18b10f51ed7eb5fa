"""Every figure the registry of shipped models quotes (src/vlmatch/pretrained/registry.json) equals the results file
it was copied from: the val recalls of the float32 and float16 weights, the default pair's and the epochs
(experiments/results/shipped/NAME.json, written by release/ship.py; the float32 recalls also against the training
run's row, experiments/results/flickr8k/RUN.json, or the grounding run's record), the calibration's beta, banks and
held-out figures (experiments/results/calibration/RUN.json and the shipped calibration.json), the explainer's
pointing figures and reading (experiments/results/grounding/ROW.json), the default pair's search figures
(benchmarks/results/search.json), the duplicates limits (benchmarks/results/duplicates_copies.json) and the
open-vocabulary fusion (experiments/results/open_vocab/protocol.json and relevance.json). The registry's prose
(notes, the explainer's selection, the calibration's method) quotes only figures its results hold, and its notes are
its recipe's; its ``selected`` (what was chosen on the val data, among how many) is what its rows and recipe give. A
figure edited by hand, or a results file re-run without shipping again, is a problem; tests/release/test_check.py
changes every number of the registry in turn and shows each change named.

    python release/ship.py --check     # one line per problem; exit status 1 if there is any
"""

from __future__ import annotations

import json
import re
import statistics
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments" / "results"
BENCHMARKS = ROOT / "benchmarks" / "results"
TOLERANCE = 0.006  # the registry rounds to 2 decimals


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _leaf_diffs(a, b, path: str = "", tol: float = TOLERANCE) -> list[str]:
    """The dotted paths where two JSON values differ: numbers within ``tol`` are equal (TOLERANCE for recalls the
    registry rounds to 2 decimals; 0 for figures copied whole, such as weights and knots); a key on one side only, or
    lists of other lengths, differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in
                (_leaf_diffs(a[k], b[k], f"{path}.{k}" if path else str(k), tol) if k in a and k in b
                 else [f"{path}.{k}" if path else str(k)])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _leaf_diffs(x, y, f"{path}[{i}]", tol)]
    if isinstance(a, bool) or isinstance(b, bool):
        return [] if a is b else [path or "(the whole value)"]
    if isinstance(a, int | float) and isinstance(b, int | float):
        return [] if abs(a - b) <= tol else [path or "(the whole value)"]
    return [] if a == b else [path or "(the whole value)"]


def _close(a, b) -> bool:
    return isinstance(a, int | float) and isinstance(b, int | float) and abs(a - b) <= TOLERANCE


def public_command(command: str) -> str:
    """A recorded command as a registry entry and its card quote it: the Entities folder named as the docs name it,
    not by where it lay on the machine that ran it."""
    return re.sub(r"data\.entities=\S+", "data.entities=flickr30k_entities", command)


def quoting_rows(entry, experiments: Path = EXPERIMENTS) -> list[Path]:
    """The experiments/flickr8k.py rows whose command the entry quotes (the run it was trained by)."""
    want = public_command(entry.command)
    return [p for p in sorted((experiments / "flickr8k").glob("*.json"))
            if isinstance(rec := _json(p), dict) and public_command(str(rec.get("command", ""))) == want]


def run_record(entry, experiments: Path = EXPERIMENTS) -> dict | None:
    """The experiments/flickr8k.py record of the run an entry was trained by (the one whose command it quotes)."""
    rows = quoting_rows(entry, experiments)
    return _json(rows[0]) if rows else None


def val_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    raw = entry.calibration["uncalibrated"] if entry.calibration else entry.val["float32"]
    rec = run_record(entry, experiments)
    out = []
    if rec is not None:
        for k, v in rec["metrics"].items():
            if k in raw and not _close(raw[k], round(v, 2)):
                out.append(f"val {k} {raw[k]} is not its run's {round(v, 2)} (the row whose command the entry quotes)")
    else:  # trained by the grounding study: its record holds the val rsum
        run = _run_name(entry, experiments) or "?"
        path = experiments / "grounding" / f"{run}.json"
        if not path.is_file():
            return [f"no results row quotes its command, and no {path.relative_to(ROOT)}"]
        if not _close(raw["rsum"], _json(path)["val_rsum"]):
            out.append(f"val rsum {raw['rsum']} is not {path.name}'s val_rsum {_json(path)['val_rsum']}")
    if entry.val_rsum != entry.val["float16"]["rsum"]:
        out.append(f"val_rsum {entry.val_rsum} is not its float16 figure {entry.val['float16']['rsum']}")
    return out


def shipped_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    """The entry's ``val`` block against its shipping's row (experiments/results/shipped/NAME.json)."""
    path = experiments / "shipped" / f"{entry.name}.json"
    if not path.is_file():
        return [f"no shipped row {path.name} (release/ship.py writes it when it ships the weights)"]
    row = _json(path)
    if row.get("sha256") != entry.sha256:
        return [f"its shipped row {path.name} is of other weights ({str(row.get('sha256'))[:12]}...)"]
    return [f"val.{d} {_get(entry.val, d)!r} is not its shipped row's {_get(row['val'], d)!r}"
            for d in _leaf_diffs(entry.val, row["val"], tol=0)]


def _get(obj, dotted: str):
    for part in re.split(r"\.|\[(\d+)\]", dotted):
        if part in (None, ""):
            continue
        try:
            obj = obj[int(part)] if isinstance(obj, list) else obj.get(part)
        except (AttributeError, IndexError, ValueError):
            return None
    return obj


def calibration_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    if not entry.calibration:
        return []
    cal, out = entry.calibration, []
    run = cal["command"].split("--model ", 1)[1].split()[0]
    rec = _json(experiments / "calibration" / f"{run.replace(':', '_')}.json")
    row = rec["settings"][rec.get("shipped_setting", {"text": 1, "both": 2}.get(rec.get("written")))]
    if cal["command"] != rec["command"]:
        out.append(f"calibration command is not its record's ({rec['command']})")
    if cal["beta"] != row["beta"]:  # the beta written is the one picked on half A
        out.append(f"calibration beta {cal['beta']} is not its record's {row['beta']}")
    out += [f"calibrated val {d} {entry.val['float32'].get(d)!r} is not its record's {row['val'].get(d)!r}"
            for d in _leaf_diffs({k: entry.val["float32"].get(k) for k in row["val"]},
                                 {k: round(v, 2) for k, v in row["val"].items()}, tol=0)]
    out += [f"uncalibrated {d} {cal['uncalibrated'].get(d)!r} is not its record's {rec['uncalibrated']['val'].get(d)!r}"
            for d in _leaf_diffs(cal["uncalibrated"], {k: round(v, 2) for k, v in rec["uncalibrated"]["val"].items()},
                                 tol=0)]
    shipped = ROOT / "src" / "vlmatch" / "pretrained" / "weights" / entry.name / "calibration.json"
    if shipped.is_file():
        file = _json(shipped)
        out += [f"calibration {d} is not the shipped calibration.json's" for d in
                _leaf_diffs({k: cal.get(k) for k in ("beta", "banks", "sha256")},
                            {k: file.get(k) for k in ("beta", "banks", "sha256")}, tol=0)]
    held = cal.get("held_out")
    if not held:
        return out + ["quotes no held-out figures of its calibration"]
    model = held["command"].split("--model ", 1)[1].split()[0]
    rec = _json(experiments / "calibration" / f"{model.replace(':', '_')}.json")
    row = rec["settings"][rec["shipped_setting"]]
    want = {"B": row["B"], "A": row["A"], "beta_B": row["beta_B"], "mean": row["held_out"], "banks": rec["banks_cross_fit"],
            "uncalibrated": {h: rec["uncalibrated"][h]["rsum"] for h in ("A", "B")}, "command": rec["command"]}
    if model != f"pretrained:{entry.name}" or row["beta"] != cal["beta"]:
        out.append(f"the held-out record {model} is not of this entry's shipped calibration")
    out += [f"calibration held_out.{k} {held.get(k)!r} is not its record's {v!r}" for k, v in want.items() if held.get(k) != v]
    return out


def explainer_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    ex = entry.explainer
    if not ex:
        return []
    g = _json(experiments / "grounding" / f"{ex['row']}.json")
    out = [f"explainer {k} {ex.get(k)!r} is not its grounding row's {g.get(k)!r}"
           for k in ("method", "pointing", "centre", "caption_mean", "ceiling", "phrases") if ex.get(k) != g.get(k)]
    if bool(ex.get("default")) != bool(entry.default):  # `vlmatch explain`'s default maps are the default model's
        out.append(f"explainer default {ex.get('default')!r}, but the entry is {'' if entry.default else 'not '}the "
                   "default model (whose own maps `vlmatch explain` draws by default)")
    if bool(ex.get("mirror")) != bool(g.get("mirror")):
        out.append(f"explainer mirror {ex.get('mirror')!r} is not its grounding row's reading (mirror "
                   f"{bool(g.get('mirror'))})")
    if "pointing_ci95" in ex and ex["pointing_ci95"] != g.get("pointing_ci95"):
        out.append(f"explainer pointing_ci95 {ex['pointing_ci95']!r} is not its grounding row's {g.get('pointing_ci95')!r}")
    if ex["by_type"] != {t: v["pointing"] for t, v in g["by_type"].items()}:
        out.append("explainer by_type is not its grounding row's pointing by type")
    return out


def default_search_figures(benchmarks: Path = BENCHMARKS) -> dict:
    """The shipped default's search figures as the search runs, with the open-vocabulary concept columns: the build
    speed and the text-query latency at 100,000 photos of benchmarks/open_vocab_cost.py (its "with" side, every
    run), the two-stage text -> photo R@10 of ``benchmarks/search.py real --pair default`` (its index carries the
    concept columns; exhaustive: the ranker's own full matrix)."""
    cost = _json(benchmarks / "open_vocab_cost.json")
    res = _json(benchmarks / "search.json")
    from vlmatch.pretrained import default_pair

    model = f"pretrained:{default_pair()[0]}"
    real = next(r for r in res["real"] if r["model"] == model)
    runs, lat = cost["build"]["images_per_s"]["with"], cost["latency"]
    total = lat["latency"]["with"]["total"]
    flags = cost["host"]["flags"]
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"
    return {"build_images_per_s": round(statistics.median(runs), 1),  # the median of the runs, not the best
            "build_images_per_s_range": [round(min(runs), 1), round(max(runs), 1)], "build_runs": len(runs),
            "build_note": f"{cost['build']['images']} Flickr8k val JPEGs, feature extraction, the concept columns and "
                          "the model's encodings included, model loading and the commit too",
            "query_p50_ms": round(total["p50_ms"], 1), "query_p99_ms": round(total["p99_ms"], 1),
            "n_images": lat["n"],
            "latency_note": "text encoding and stage 1 (HNSW over the model's and the concept columns: the fused score) "
                            "included, batch 1",
            "two_stage_r10": round(real["two_stage_t2i"]["100"]["r10"], 2),
            "exhaustive_r10": round(real["exhaustive"]["t2i"]["r10"], 2),
            "host": f"2 x86 cores ({cost['host']['cpu']}) with {isa} (host flags and commands in "
                    "benchmarks/results/open_vocab_cost.md and search.md)"}


def search_problems(entry, benchmarks: Path = BENCHMARKS) -> list[str]:
    if bool(entry.search or entry.ms_per_query is not None) != bool(entry.default):
        return ["only the default pair quotes search figures"]
    if not entry.search:
        return []
    want = default_search_figures(benchmarks)
    out = [f"search {k} {entry.search.get(k)!r} is not the benchmarks' {v!r} (release/check.py default_search_figures)"
           for k, v in want.items() if entry.search.get(k) != v]
    if entry.ms_per_query != want["query_p50_ms"]:
        out.append(f"ms_per_query {entry.ms_per_query} is not the search figures' p50 {want['query_p50_ms']}")
    return out


def duplicates_problems(entry) -> list[str]:
    """The model's own duplicates limits (the similarity threshold and, with the copy signal, its bits) and their
    held-out figures against the results file it cites (a path from the repository root)."""
    d = entry.duplicates
    if not d:
        return []
    path = ROOT / str(d.get("results", ""))
    res = _json(path) if d.get("results") and path.is_file() else None
    if res is None or res.get("model") != entry.name:
        return [f"duplicates cites {d.get('results')!r}, not a results file of this model"]
    chosen = res.get("chosen") or {"threshold": res["threshold"]}  # the copy signal's limits, where it has them
    want = {**chosen, "pair_precision": round(res["half_b"]["pair_precision"], 3),
            "pair_recall": round(res["half_b"]["pair_recall"], 3)}
    return [f"duplicates {k} {d.get(k)!r} is not {d['results']}'s {v!r}" for k, v in want.items() if d.get(k) != v]


def open_vocab_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    """The fusion record against the rows that chose it: the form, weights, ratio and projection from
    open_vocab/protocol.json's shipped choice, the relevance knots and threshold from relevance.json."""
    ov = entry.open_vocab
    if not ov:
        return []
    rows = experiments / "open_vocab"
    chosen = _json(rows / "protocol.json")
    pick = chosen["choice_shipped"]
    form = chosen["forms"][pick["form"]]
    want = {"w0": pick["w0"], "slope": pick["slope"], "ratio": pick["ratio_default"], "text": form["text"],
            "concepts": form["concepts"], "dims": form["dims"], "relevance": _json(rows / "relevance.json")["shipped"],
            "and_beta": 0.0}  # the AND re-scoring: measured (two_things_*.json) and shipped off
    got = {k: ov.get(k) for k in want}
    return [f"open_vocab {d} is not its rows' (open_vocab/protocol.json, relevance.json)"
            for d in _leaf_diffs(got, want, tol=0)]


PROSE_FIELDS = ("notes", "explainer.selection", "calibration.method")  # the entry's prose, with figures in it
NAMED_RESULTS = re.compile(r"(?:experiments|benchmarks)/results/[\w./-]*\w")


def prose_sources(entry, experiments: Path = EXPERIMENTS) -> list[Path]:
    """The results an entry's prose may quote: its run's record, its grounding row and calibration records, its
    shipped row, the Flickr8k and grounding tables, and every results file or folder the prose names."""
    run = _run_name(entry, experiments)
    rows = [entry.explainer["row"]] if entry.explainer else []
    found = [experiments / "shipped" / f"{entry.name}.json", experiments / "flickr8k.md", experiments / "grounding.md",
             *[p for r in rows for p in sorted((experiments / "grounding").glob(f"{r}.*"))],
             *(sorted(experiments.glob(f"*/{run}.*")) if run else []),
             *(sorted(experiments.glob(f"*/{run}_*.*")) if run else []), *quoting_rows(entry, experiments)]
    for field in PROSE_FIELDS:
        for named in NAMED_RESULTS.findall(str(_get(entry.__dict__, field) or "")):
            path = ROOT / named
            found += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path, path.with_suffix(
                ".json")]
    return [p for p in dict.fromkeys(found) if p.is_file()]


def prose_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    """A figure of the entry's prose (notes, the explainer's selection, the calibration's method) that none of its
    results holds: typed by hand, or left from an earlier shipping (release/figures.py's rule for the docs)."""
    from figures import figures, file_values, sourced

    values = {x for p in prose_sources(entry, experiments) for x in file_values(p)}
    return [f"{field}: {fig} is in none of its results" for field in PROSE_FIELDS
            for _, fig in figures(str(_get(entry.__dict__, field) or "")) if not sourced(fig, values)]


def recipe_problems(entry) -> list[str]:
    """The notes are written once, in the model's recipe (experiments/recipes/pretrained/NAME.yaml, recipe.ship.notes):
    the registry's must be that text."""
    ship = _recipe_ship(entry.name)
    if not ship:
        return []
    return [] if ship.get("notes", "") == entry.notes else [
        f"notes differ from its recipe's recipe.ship.notes ({entry.name}.yaml): ship it again or copy nothing by hand"]


@cache
def _recipe(name: str) -> tuple[dict, dict]:
    """(config, recipe section) of a shipped model's recipe (experiments/recipes/pretrained/NAME.yaml), read and
    checked as the runner reads it (vlmatch_lab.recipes), or ({}, {}); read once per process."""
    from vlmatch_lab.recipes import read_recipe

    path = ROOT / "experiments" / "recipes" / "pretrained" / f"{name}.yaml"
    return read_recipe(path) if path.is_file() else ({}, {})


def _recipe_ship(name: str) -> dict:
    """The ship section of a shipped model's recipe, or {}."""
    return _recipe(name)[1].get("ship") or {}


def _run_name(entry, experiments: Path = EXPERIMENTS) -> str | None:
    """The run an entry's weights come from: ``--name`` of its recorded command, else the ``--model`` its calibration
    was made for, else the Flickr8k row whose command it quotes (a run of experiments/run.py records its recipe)."""
    for command, flag in ((entry.command, "--name "), ((entry.calibration or {}).get("command", ""), "--model ")):
        if flag in command:
            return command.split(flag, 1)[1].split()[0]
    rows = quoting_rows(entry, experiments)
    return rows[0].stem if rows else None


def run_row(run: str, experiments: Path = EXPERIMENTS) -> dict | None:
    """A run's figures on val: {"rsum", "pointing"} from its Flickr8k row and its grounding row (None: neither)."""
    f8k, g = experiments / "flickr8k" / f"{run}.json", experiments / "grounding" / f"{run}.json"
    if not f8k.is_file() and not g.is_file():
        return None
    row = _json(g) if g.is_file() else {}
    rsum = _json(f8k)["metrics"]["rsum"] if f8k.is_file() else row.get("val_rsum")
    return {"rsum": rsum, "pointing": row.get("pointing")}


def has_row(run: str, experiments: Path = EXPERIMENTS) -> bool:
    return run_row(run, experiments) is not None


BY = {"val rsum": "rsum", "pointing": "pointing"}  # a recipe's `by`: the figure of each candidate's row it compares
GROUNDING_ROW = r"(?:contribution|attention|gradient)(?:_mirror)?"  # a grounding row's suffix after its run's name


def _declared(d: dict, experiments: Path) -> dict:
    """A recipe's choice as the registry records it: ``among`` a list of candidate runs compared on all of val by
    ``by``, or ``crossfit`` a cross-fitted choice's record (experiments/results/grounding_choices/NAME.json: the
    candidates it chose among, the rsum floor applied on all of val, each half's pick reported on the other)."""
    if "crossfit" in d:
        rec = _json(experiments / "grounding_choices" / f"{d['crossfit']}.json")
        floor = (f", among the {len(rec['rows'])} runs tried those whose val rsum (all of val) is at least "
                 f"{rec['min_rsum']:g}") if rec.get("min_rsum") is not None else ""
        picks = {p["run"] for p in rec["picks"].values()}
        return {"what": d["what"], "among": list(rec["candidates"]), "by": f"pointing{floor}",
                "cross_fitted": picks == {rec["chosen_on_all"]["run"]}}
    return {"what": d["what"], "among": list(d["among"]), "by": d["by"], "cross_fitted": False}


def selection_record(entry, declared: list[dict] | None = None, experiments: Path = EXPERIMENTS) -> list[dict]:
    """What was chosen on the val data the entry's figures are measured on, and among how many: the epoch (its
    shipping's row: epochs trained), the calibration's beta (the betas its calibration record tried on half A) and
    banks (the bank settings that could ship; cross-fitted where its record has both halves' choices), then the
    choices its recipe declares (``ship.selected``: candidate runs by name, or a cross-fitted choice's record). The
    registry's ``selected`` is this."""
    out = []
    if (entry.val.get("epochs_trained") or 0) >= 2:
        out.append({"what": "the epoch", "among": int(entry.val["epochs_trained"]), "by": "val rsum",
                    "cross_fitted": False})
    cal = experiments / "calibration" / f"{_run_name(entry, experiments)}.json"
    if entry.calibration and cal.is_file():
        rec = _json(cal)
        betas = {b for st in rec["settings"] for b in st.get("curve_A", {})}
        # picked on half A of val: the figures of all of val include that half (the card's held-out ones do not)
        out.append({"what": "the calibration's beta", "among": len(betas), "by": "rsum on half A of val",
                    "cross_fitted": False})
        shippable = [st for st in rec["settings"] if str(st.get("setting", "")).startswith("shipped")]
        crossed = rec.get("banks_cross_fit") or {}
        out.append({"what": "the calibration's banks", "among": len(shippable), "by": "rsum" if crossed else "val rsum",
                    "cross_fitted": bool(crossed) and crossed.get("chosen_on_A") == crossed.get("chosen_on_B")})
    if entry.open_vocab:  # the search's fusion with the concept scorer and its relevance (open_vocab's rows)
        proto = _json(experiments / "open_vocab" / "protocol.json")
        out.append({"what": "the open-vocabulary fusion (form, w0, slope)", "among": int(proto["candidates"]),
                    "by": "held-out concept-query recall, home and default queries held within a floor",
                    "cross_fitted": False})
        rel = _json(experiments / "open_vocab" / "relevance.json")["selected"]
        out.append({"what": rel["what"], "among": len(rel["among"]), "by": rel["by"],
                    "cross_fitted": bool(rel["cross_fitted"])})
    declared = _recipe_ship(entry.name).get("selected", []) if declared is None else declared
    return out + [_declared(d, experiments) for d in declared]


def selection_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    """The registry's ``selected`` against what the rows and the recipe give (run ``release/ship.py --selected``
    after changing either); every candidate run has its results row; the entry's own run is among them, and where a
    recipe says a choice was made by a figure (``by``: val rsum, pointing), its run has the best of them."""
    want = selection_record(entry, experiments=experiments)
    out = [f"{p} {_get({'selected': entry.selected}, p)!r} is not what its rows give "
           f"({_get({'selected': want}, p)!r}): release/ship.py --selected writes it"
           for p in _leaf_diffs(entry.selected, want, "selected", tol=0)]
    run = _run_name(entry, experiments)
    for c in [*want, *(c for c in entry.selected if c not in want)]:
        if not isinstance(c.get("among"), list):
            continue
        rows = {r: run_row(r, experiments) for r in c["among"]}
        out += [f"selected: {c['what']}: candidate {r} has no results row" for r, row in rows.items() if row is None]
        # the run itself, or its grounding row (RUN_METHOD[_mirror]), not a sibling run such as RUN_s1
        own = [r for r in c["among"] if r == run or re.fullmatch(rf"{re.escape(run)}_{GROUNDING_ROW}", r)] if run else []
        if run and not own:
            out.append(f"selected: {c['what']}: its own run {run} is not among the candidates")
        key = BY.get(c["by"])
        if key and own and all(row is not None for row in rows.values()):
            best = max(rows, key=lambda r: rows[r][key] if rows[r][key] is not None else float("-inf"))
            if best not in own:
                out.append(f"selected: {c['what']}: by {c['by']}, {best} ({rows[best][key]}) beats its own run "
                           f"{own[0]} ({rows[own[0]][key]})")
    return out


def entry_problems(entry, experiments: Path = EXPERIMENTS, benchmarks: Path = BENCHMARKS) -> list[str]:
    """``"NAME: what differs"`` for each figure of registry entry ``entry`` that is not its results file's."""
    found = (val_problems(entry, experiments) + shipped_problems(entry, experiments)
             + calibration_problems(entry, experiments) + explainer_problems(entry, experiments)
             + search_problems(entry, benchmarks) + duplicates_problems(entry)
             + open_vocab_problems(entry, experiments) + prose_problems(entry, experiments)
             + recipe_problems(entry) + selection_problems(entry, experiments))
    return [f"{entry.name}: {p}" for p in found]


def check_registry(entries=None, experiments: Path = EXPERIMENTS, benchmarks: Path = BENCHMARKS) -> list[str]:
    """Every problem of every entry of the registry (the package's own when ``entries`` is None)."""
    if entries is None:
        from vlmatch import pretrained

        entries = pretrained.entries()
    return [p for e in entries for p in entry_problems(e, experiments, benchmarks)]


# fields that change what the package does, each against the file it was written from
SHIP_FIELDS = {"role": "role", "default": "default", "pair_score": "pair_score"}  # registry field -> recipe.ship key


def _shipped_constants() -> dict:
    """release/ship.py's DATA and LICENCE, the text every shipping writes (read without running ship.py)."""
    import ast

    tree = ast.parse((ROOT / "release" / "ship.py").read_text(encoding="utf-8"))
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and t.id in ("DATA", "LICENCE")}


def behaviour_problems(entry) -> list[str]:
    """The fields that change what a shipped model does, against their sources: its config, model and features
    (input size, grid, normalisation) against the shipped folder's config.json and backbone.json (sealed with the
    weights) and its recipe's features; its role, default and pair score against its recipe's ship section; its
    data and licence against release/ship.py's; its open-vocabulary word list against its recipe's training data
    and the lists that ship."""
    out = []
    folder = ROOT / "src" / "vlmatch" / "pretrained" / "weights" / entry.name
    cfg = _json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if cfg.get("name") != entry.model:
        out.append(f"model {entry.model!r} is not its config.json's {cfg.get('name')!r}")
    out += [f"config.{d} is not its config.json's" for d in _leaf_diffs(entry.config, cfg.get("config", {}), tol=0)]
    backbone = _json(folder / "backbone.json") if (folder / "backbone.json").is_file() else {}
    out += [f"features.{d} {entry.features.get(d)!r} is not its backbone.json's {backbone.get(d)!r}"
            for d in _leaf_diffs(entry.features, backbone, tol=0)]
    _, rec = _recipe(entry.name)
    feats = rec.get("features") or {}
    for k, want in (("name", feats.get("backbone")), ("input_size", feats.get("input_size"))):
        if want is not None and entry.features.get(k) != want:
            out.append(f"features.{k} {entry.features.get(k)!r} is not its recipe's features "
                       f"{'backbone' if k == 'name' else k} {want!r}")
    ship = rec.get("ship") or {}
    for field, key in SHIP_FIELDS.items():
        want = ship.get(key, {"default": False, "pair_score": "model"}.get(key))
        if ship and getattr(entry, field) != want:
            out.append(f"{field} {getattr(entry, field)!r} is not its recipe's ship.{key} {want!r}")
    if ship and (entry.explainer or {}).get("row") != ship.get("explainer"):
        out.append(f"explainer row {(entry.explainer or {}).get('row')!r} is not its recipe's ship.explainer "
                   f"{ship.get('explainer')!r}")
    said = _shipped_constants()
    out += [f"{field} is not release/ship.py's {const} (what a shipping writes)"
            for field, const in (("data", "DATA"), ("licence", "LICENCE")) if getattr(entry, field) != said.get(const)]
    words = (entry.open_vocab or {}).get("words")
    if words:
        split = ((_recipe(entry.name)[0].get("data") or {}).get("train_split")) or "train"
        want = f"{rec.get('data')}-{split}" if rec else words
        if words != want:
            out.append(f"open_vocab.words {words!r} is not its recipe's training captions ({want!r})")
        if not (ROOT / "src" / "vlmatch" / "pretrained" / "words" / f"{words}.txt").is_file():
            out.append(f"open_vocab.words {words!r}: no such list ships (src/vlmatch/pretrained/words/)")
    return out


def card_problems() -> list[str]:
    """Each generated block (the model cards, the README's model table, the default's calibration paragraph) of
    the README and docs against what the checkout's registry renders now."""
    from vlmatch.pretrained import card

    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for kind, (begin, end, fill) in card.BLOCKS.items():
            a, b = text.find(begin), text.find(end)
            if a >= 0 and b > a and text[a + len(begin):b] != "\n" + fill():
                out.append(f"{path.relative_to(ROOT)}: its {kind} block ({begin}) is not what the registry renders: "
                           "python release/ship.py --card")
    return out


def checkout_problems() -> list[str]:
    """The package read is this checkout's (src/vlmatch beside release/), not one installed from elsewhere."""
    import vlmatch

    here = Path(vlmatch.__file__).resolve().parent
    want = ROOT / "src" / "vlmatch"
    return [] if here == want else [f"the vlmatch package read is {here}, not this checkout's {want}: run "
                                    "release/ship.py from the checkout (it puts its src/ first)"]


def check_checkout(entries=None) -> list[str]:
    """Every problem `release/ship.py --check` finds in the checkout beside it, but the prose figures
    (release/figure_sources.py): the registry's figures, its behaviour fields, the generated blocks."""
    problems = checkout_problems()
    if problems:
        return problems
    if entries is None:
        from vlmatch import pretrained

        entries = pretrained.entries()
    return (check_registry(entries) + [f"{e.name}: {p}" for e in entries for p in behaviour_problems(e)]
            + card_problems())
