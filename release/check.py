"""Every figure the registry of shipped models quotes (src/vlmatch/pretrained/registry.json) equals the results file
it was copied from: the val recalls (experiments/results/flickr8k/RUN.json, or the grounding run's record), the
calibration's beta and held-out figures (experiments/results/calibration/RUN.json), the explainer's pointing figures
(experiments/results/grounding/ROW.json) and the default pair's search figures (benchmarks/results/search.json).
A figure edited by hand, or a results file re-run without shipping again, is a problem.

    python release/ship.py --check     # one line per problem; exit status 1 if there is any
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments" / "results"
BENCHMARKS = ROOT / "benchmarks" / "results"
TOLERANCE = 0.006  # the registry rounds to 2 decimals


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _close(a, b) -> bool:
    return isinstance(a, int | float) and isinstance(b, int | float) and abs(a - b) <= TOLERANCE


def public_command(command: str) -> str:
    """A recorded command as a registry entry and its card quote it: the Entities folder named as the docs name it,
    not by where it lay on the machine that ran it."""
    return re.sub(r"data\.entities=\S+", "data.entities=flickr30k_entities", command)


def run_record(entry, experiments: Path = EXPERIMENTS) -> dict | None:
    """The experiments/flickr8k.py record of the run an entry was trained by (the one whose command it quotes)."""
    for p in sorted((experiments / "flickr8k").glob("*.json")):
        rec = _json(p)
        if isinstance(rec, dict) and public_command(str(rec.get("command", ""))) == public_command(entry.command):
            return rec
    return None


def val_problems(entry, experiments: Path = EXPERIMENTS) -> list[str]:
    raw = entry.calibration["uncalibrated"] if entry.calibration else entry.val["float32"]
    rec = run_record(entry, experiments)
    out = []
    if rec is not None:
        for k, v in rec["metrics"].items():
            if k in raw and not _close(raw[k], round(v, 2)):
                out.append(f"val {k} {raw[k]} is not its run's {round(v, 2)} (the row whose command the entry quotes)")
    else:  # trained by the grounding study: its record holds the val rsum
        run = entry.command.split("--name ", 1)[1].split()[0] if "--name " in entry.command else "?"
        path = experiments / "grounding" / f"{run}.json"
        if not path.is_file():
            return [f"no results row quotes its command, and no {path.relative_to(ROOT)}"]
        if not _close(raw["rsum"], _json(path)["val_rsum"]):
            out.append(f"val rsum {raw['rsum']} is not {path.name}'s val_rsum {_json(path)['val_rsum']}")
    if entry.val_rsum != entry.val["float16"]["rsum"]:
        out.append(f"val_rsum {entry.val_rsum} is not its float16 figure {entry.val['float16']['rsum']}")
    return out


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
    if not _close(cal["uncalibrated"]["rsum"], rec["uncalibrated"]["val"]["rsum"]):
        out.append(f"uncalibrated rsum {cal['uncalibrated']['rsum']} is not its record's {rec['uncalibrated']['val']['rsum']}")
    if not _close(entry.val["float32"]["rsum"], row["val"]["rsum"]):
        out.append(f"calibrated val rsum {entry.val['float32']['rsum']} is not its record's {row['val']['rsum']}")
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
    out = [f"explainer {k} {ex[k]!r} is not its grounding row's {g[k]!r}"
           for k in ("method", "pointing", "centre", "caption_mean", "ceiling", "phrases") if ex[k] != g[k]]
    if ex["by_type"] != {t: v["pointing"] for t, v in g["by_type"].items()}:
        out.append("explainer by_type is not its grounding row's pointing by type")
    return out


def search_problems(entry, benchmarks: Path = BENCHMARKS) -> list[str]:
    if bool(entry.search or entry.ms_per_query is not None) != bool(entry.default):
        return ["only the default pair quotes search figures"]
    if not entry.search:
        return []
    res = _json(benchmarks / "search.json")
    pair = res["default_pair"]
    real = next(r for r in res["real"] if r["model"] == pair["build"]["model"])
    scale, s, runs = pair["scale"][-1], entry.search, pair["build"]["runs_images_per_s"]
    want = {"build_images_per_s": round(statistics.median(runs), 1),  # the median of the runs, not the best
            "build_images_per_s_range": [round(min(runs), 1), round(max(runs), 1)],
            "query_p50_ms": round(scale["latency"]["total"]["p50_ms"], 1),
            "query_p99_ms": round(scale["latency"]["total"]["p99_ms"], 1), "n_images": scale["n"],
            "two_stage_r10": round(real["two_stage_t2i"]["100"]["r10"], 2),
            "exhaustive_r10": round(real["exhaustive"]["t2i"]["r10"], 2)}
    out = [f"search {k} {s.get(k)!r} is not benchmarks/results/search.json's {v!r}" for k, v in want.items() if s.get(k) != v]
    if entry.ms_per_query != want["query_p50_ms"]:
        out.append(f"ms_per_query {entry.ms_per_query} is not the search figures' p50 {want['query_p50_ms']}")
    return out


def entry_problems(entry, experiments: Path = EXPERIMENTS, benchmarks: Path = BENCHMARKS) -> list[str]:
    """``"NAME: what differs"`` for each figure of registry entry ``entry`` that is not its results file's."""
    found = (val_problems(entry, experiments) + calibration_problems(entry, experiments)
             + explainer_problems(entry, experiments) + search_problems(entry, benchmarks))
    return [f"{entry.name}: {p}" for p in found]


def check_registry(entries=None, experiments: Path = EXPERIMENTS, benchmarks: Path = BENCHMARKS) -> list[str]:
    """Every problem of every entry of the registry (the package's own when ``entries`` is None)."""
    if entries is None:
        from vlmatch import pretrained

        entries = pretrained.entries()
    return [p for e in entries for p in entry_problems(e, experiments, benchmarks)]
