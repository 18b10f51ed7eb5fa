"""Grounding on Flickr8k val: the pointing game of Flickr30k Entities boxes for models x explanation methods.

    python experiments/grounding.py --row shipped_rescorer_attention --model pretrained:scan-t2i-minilm-f8k --method attention
    python experiments/grounding.py --row g35_vsepp_gl30 \
        --model ${VLMATCH_CACHE:-~/.cache/vlmatch}/runs/g35_vsepp_gl30/best --method contribution
    python experiments/grounding.py --rerender
    python experiments/grounding.py --crossfit g48_default --rows ROW ROW ... --min-rsum 337

Each row runs ``vlmatch.evaluation.grounding.pointing_game`` on the val split (Karpathy val, 1,000 images,
every phrase of their captions with a box; the test split's annotations are held back) of the features the
model was trained on (``$VLMATCH_CACHE/flickr8k-<backbone>[-<size>]``, made by ``experiments/flickr8k.py``),
and writes ``experiments/results/grounding/<row>.json`` (the figures, the command, the host's CPU flags). All
rows are rendered to ``experiments/results/grounding.md``. The val rsum of a trained run is read from its
``experiments/results/flickr8k/<run>.json`` where there is one, so recall stands beside pointing.

A row file is one JSON object, one top-level key a line (:func:`row_text`); its per-image counts, which the
pointing game keeps as columns (``names``, ``hits``, ``phrases``), are stored one image a line
(``"per_image": {"columns": [...], "rows": [[name, hits, phrases], ...]}``) and read back as columns by
:func:`read_row`. The summary figures are plain top-level keys, so a reader of those alone needs only ``json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from vlmatch.io import write_json, write_text
from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
CACHE_ROOT = cache_root()  # the rooms' one cache: features, run folders

ENTITIES = data_root(check=False) / "flickr30k_entities"
SHARED_F8K = data_root(check=False) / "flickr8k"  # the photos, when a checkpoint's feature cache is not made
RESULTS = HERE / "results"
ROWS = RESULTS / "grounding"
CHOICES = RESULTS / "grounding_choices"  # cross-fitted choices among rows (--crossfit)
BENCH_PAGE = HERE.parent / "benchmarks" / "results" / "grounding.md"  # the seed table beside the other figures
TYPES = ("people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other")


def features_for(checkpoint: str) -> Path:
    """The val feature cache of the backbone the checkpoint was trained on (it may not exist yet)."""
    from vlmatch.features.provenance import checkpoint_backbone
    from vlmatch.models.registry import resolve_checkpoint

    bb = checkpoint_backbone(resolve_checkpoint(checkpoint)) or {}
    name, size = bb.get("name", "efficientnet-lite0"), bb.get("input_size", 224)
    return CACHE_ROOT / (f"flickr8k-{name}" + ("" if size in (None, 224) else f"-{size}"))


def val_views(checkpoint: str, max_images: int | None, mirror: bool):
    """(features, names, the mirror views' features or None, a label of where the features came from) of Flickr8k
    val: the checkpoint's feature cache where it was extracted (the mirror views from the photos it names), else
    extracted now from $VLMATCH_DATA/flickr8k's val photos with the checkpoint's backbone."""
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.features.backbones import backbone_for
    from vlmatch.features.provenance import resolve_backbone
    from vlmatch.features.views import photo_features
    from vlmatch.models.registry import resolve_checkpoint

    folder = features_for(checkpoint)
    if (folder / "dev_ims.npy").is_file():
        split = PrecompSplit(folder, "dev", max_images=max_images)
        described = json.loads((folder / "features.json").read_text())
        images, names, feats, label = Path(described["images_dir"]), split.ids, split.features, folder.name
        bb = backbone_for(described["backbone"]) if mirror else None
    else:
        meta = json.loads((SHARED_F8K / "dataset_flickr8k.json").read_text())
        names = [im["filename"] for im in meta["images"] if im.get("split") == "val"][:max_images]
        images, bb = SHARED_F8K / "images", backbone_for(resolve_backbone(resolve_checkpoint(checkpoint), None))
        label = f"photos ({bb.info.name}, {bb.info.input_size} px, extracted now)"
        feats = photo_features(bb, [images / n for n in names], progress=True, desc="val photos")
    if mirror and not images.is_dir():
        sys.exit(f"grounding.py: --mirror needs the val photos ({images})")
    mirrored = photo_features(bb, [images / n for n in names], mirror=True, progress=True,
                              desc="mirror views") if mirror else None
    return feats, names, mirrored, label


def run_row(a) -> dict:
    import torch

    from vlmatch.evaluation.explainers import default_method
    from vlmatch.evaluation.grounding import format_grounding, pointing_game
    from vlmatch.models.registry import load_model, resolve_checkpoint

    if a.threads:
        torch.set_num_threads(a.threads)
    if not (Path(a.entities) / "Annotations").is_dir():
        sys.exit(f"grounding.py: {a.entities} holds no Annotations/: it is the Flickr30k Entities folder "
                 "($VLMATCH_DATA/flickr30k_entities; VLMATCH_DATA defaults to ../shared beside the checkout)")
    features, names, mirrored, source = val_views(a.model, a.max_images, a.mirror)
    model = load_model(resolve_checkpoint(a.model))
    method = a.method or default_method(model)
    res = pointing_game(model, features, names, a.entities, method, progress=True,
                        phrase_as_query=a.phrase_as_query, mirror_features=mirrored)
    print(format_grounding({a.row: res}))
    run = Path(str(a.model)).parent.name if not str(a.model).startswith("pretrained:") else None
    rsum = None
    if str(a.model).startswith("pretrained:"):  # the run it was trained by: its recorded command's --name
        from vlmatch import pretrained

        entry = pretrained.get(str(a.model).split(":", 1)[1])
        rsum, words = entry.val_rsum, shlex.split(entry.command)
        run = words[words.index("--name") + 1] if "--name" in words else None
    elif run and (RESULTS / "flickr8k" / f"{run}.json").is_file():
        rsum = json.loads((RESULTS / "flickr8k" / f"{run}.json").read_text())["metrics"]["rsum"]
    row = {"row": a.row, "model": str(a.model), "run": run, "method": method, "features": source, "val_rsum": rsum,
           "note": a.note, "command": "python experiments/grounding.py " + shlex.join(sys.argv[1:]),
           "host": {"cpu": cpu_model(), "flags": cpu_flags()}, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **res}
    write_row(ROWS / f"{a.row}.json", row)
    return row


def row_text(row: dict) -> str:
    """A row as its file holds it: one JSON object, one top-level key a line, and ``per_image`` (columns of equal
    length in memory) as its column names and one line per image."""
    lines = []
    for key, value in row.items():
        if key == "per_image" and isinstance(value, dict):
            columns = list(value)
            if len({len(value[c]) for c in columns}) > 1:
                raise ValueError(f"row {row.get('row')!r}: per_image columns of different lengths")
            images = ",\n".join(f"  {json.dumps(list(r))}" for r in zip(*(value[c] for c in columns), strict=True))
            images = f"\n{images}\n " if images else ""
            lines.append(f' "per_image": {{"columns": {json.dumps(columns)}, "rows": [{images}]}}')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_row(path: Path, row: dict) -> None:
    """Write a row file (:func:`row_text`) atomically: a temporary file beside it, renamed onto it."""
    write_text(path, row_text(row))


def read_row(path: Path) -> dict:
    """A row file as the pointing game returned it: ``per_image`` as columns again."""
    row = json.loads(Path(path).read_text(encoding="utf-8"))
    per = row.get("per_image")
    if isinstance(per, dict) and "rows" in per:
        row["per_image"] = {c: [r[i] for r in per["rows"]] for i, c in enumerate(per["columns"])}
    return row


# The seed systems before and after the grounding objective (#48): (seed, map, matching-only row, taught row). The
# taught runs train the map the row reads (train.grounding_map: attention, or gradient for CAAN's and SMAN's per-word
# map) on the recorded run's features and budget.
SEEDS = [("SCAN t-i", "attention", "shipped_scan_t2i_attention", "g48_scan_t2i_ground_attention"),
         ("SCAN t-i", "contribution", "shipped_scan_t2i_contribution", "g48_scan_t2i_ground_contribution"),
         ("SCAN i-t", "attention", "c35_scan_i2t_attention", "g48_scan_i2t_ground_attention"),
         ("SCAN i-t", "contribution", "c35_scan_i2t_contribution", "g48_scan_i2t_ground_contribution"),
         ("MMCA", "attention", "c35_mmca_attention", "g48_mmca_ground_attention"),
         ("CAAN", "attention (= its caption's mean map)", "c35_caan_attention", None),
         ("CAAN", "gradient", "c35_caan_gradient", "g48_caan_ground_gradient"),
         ("SMAN", "attention (= its caption's mean map)", "c35_sman_attention", None),
         ("SMAN", "gradient", "c35_sman_gradient", "g48_sman_ground_gradient")]


def seed_table(rows: dict) -> list[str]:
    """The seed x {matching only, taught to ground} x {pointing, rsum} table, from the rows that exist."""
    def cell(name):
        r = rows.get(name) if name else None
        if r is None:
            return "-", "-"
        ci = r.get("pointing_ci95")
        return (f"{r['pointing']:.1f}" + (f" ({ci[0]:.1f}-{ci[1]:.1f})" if ci else ""),
                f"{r['val_rsum']:.1f}" if r.get("val_rsum") else "-")
    if not any(before in rows for _, _, before, _ in SEEDS):
        return []
    out = ["", "## The seed systems taught to ground", "",
           "Each seed's maps with matching alone (its recorded run) and after training with the grounding objective on",
           "the map the row reads (`train.grounding_map: attention`, or `gradient` for CAAN's and SMAN's per-word map;",
           "peak form, Entities train boxes; the same features, configuration and epochs as the recorded run). Pointing",
           "with its 95 % interval where measured; val rsum uncalibrated. CAAN's and SMAN's attention maps are their",
           "caption's mean map by construction (a phrase's map is every phrase's map): an objective on them can only",
           "move the caption's one map, not a phrase's, so their attention rows have no taught run.", "",
           "| seed | map | matching only: pointing | rsum | taught to ground: pointing | rsum |",
           "|---|---|---:|---:|---:|---:|"]
    for seed, kind, before, after in SEEDS:
        (pb, rb), (pa, ra) = cell(before), cell(after)
        out.append(f"| {seed} | {kind} | {pb} | {rb} | {('**' + pa + '**') if pa != '-' else pa} | {ra} |")
    return out


def load_rows() -> list[dict]:
    """Every row file, oldest first (read once for both pages)."""
    return sorted((read_row(p) for p in ROWS.glob("*.json")), key=lambda r: r["finished"])


def render(rows: list[dict]) -> str:
    out = ["# Grounding: the pointing game on Flickr30k Entities boxes (Flickr8k val)", "",
           "Every phrase of the 5,000 val captions whose Entities chain has a box (13,123 phrases of 1,000 images; the",
           "test split's annotations are held back). A hit: the peak cell of the phrase's heat map (its centre) lies in",
           "one of the chain's boxes. `centre`: always the photo's centre; `capmean`: the whole caption's map for",
           "every phrase of it; `ceiling`: the best any cell centre of the grid can do. Rendered by",
           "`python experiments/grounding.py --rerender` from `experiments/results/grounding/*.json`.", "",
           "`95 %`: the pointing's bootstrap interval, images resampled with their phrases (rows measured since",
           "2026-11-27; '-' before). `+ mirror`: each map is the mean of the photo's and its mirror image's, mirrored",
           "back (`--mirror`; `vlmatch.evaluation.mirror`).", "",
           "| row | model | method | features | val rsum | pointing | 95 % | centre | capmean | ceiling | phrases | "
           + " | ".join(TYPES) + " | s |",
           "|" + "---|" * (12 + len(TYPES))]
    for r in rows:
        types = " | ".join(f"{r['by_type'][t]['pointing']:.1f}" if t in r["by_type"] else "-" for t in TYPES)
        rsum = f"{r['val_rsum']:.1f}" if r.get("val_rsum") else "-"
        method = r["method"] + (" (phrase as query)" if r.get("phrases_as") == "query" and r["method"] in
                                ("attention", "contribution") else "") + (" + mirror" if r.get("mirror") else "")
        ci = r.get("pointing_ci95")
        ci = f"{ci[0]:.1f}-{ci[1]:.1f}" if ci else "-"
        out.append(f"| {r['row']} | `{r['model']}` | {method} | {r['features']} | {rsum} | **{r['pointing']:.1f}** | "
                   f"{ci} | {r['centre']:.1f} | {r['caption_mean']:.1f} | {r['ceiling']:.1f} | {r['phrases']} | {types} | "
                   f"{r['seconds']:.0f} |")
    choices = sorted(CHOICES.glob("*.json")) if CHOICES.is_dir() else []
    if choices:
        out += ["", "## Cross-fitted choices", "",
                "A run chosen by its val pointing is flattered on the phrases it was chosen on. Each choice below is",
                "made on one half of the val images (a fixed split by a hash of the file name) and reported on the",
                "other, both ways (`vlmatch.evaluation.pointing_stats.crossfit_choice`); candidates must reach the",
                "val rsum floor first.", "",
                "| choice | candidates | rsum floor | picked on half 0 -> its pointing on half 1 "
                "| picked on half 1 -> on half 0 | cross-fitted pointing | chosen on all of val |",
                "|---|---|---:|---|---|---:|---|"]
        for path in choices:
            c = json.loads(path.read_text())
            p0, p1 = c["picks"]["picked_on_0"], c["picks"]["picked_on_1"]
            out.append(f"| {c['name']} | {', '.join(c['rows'])} | {c['min_rsum'] if c['min_rsum'] is not None else '-'} | "
                       f"{p0['run']} -> {p0['reported_on_other']:.1f} | {p1['run']} -> {p1['reported_on_other']:.1f} | "
                       f"**{c['pointing']:.1f}** | {c['chosen_on_all']['run']} ({c['chosen_on_all']['pointing']:.1f}) |")
    out += ["", "The seed systems before and after the grounding objective: `benchmarks/results/grounding.md` (rendered",
            "from these rows; on the site, below).", "", "## Commands and notes", ""]
    for r in rows:
        note = f" {r['note']}" if r.get("note") else ""
        out.append(f"- **{r['row']}**: `{r['command']}`{note} (host: {r['host']['cpu']}; "
                   f"{' '.join(f for f in r['host']['flags'] if f.startswith('avx512') or f == 'avx2')})")
    return "\n".join(out) + "\n"


def render_seed_page(rows: list[dict]) -> str:
    """``benchmarks/results/grounding.md``: the seed table, rendered from the same rows."""
    rows = {r["row"]: r for r in rows}
    return "\n".join(["# Grounding: the seed systems before and after the grounding objective (Flickr8k val)", "",
                      "Rendered by `python experiments/grounding.py --rerender` from `experiments/results/grounding/"
                      "*.json`; every row with its command, per phrase type and the other methods: "
                      "`experiments/results/grounding.md`."] + seed_table(rows)) + "\n"


def crossfit(a) -> dict:
    """The cross-fitted choice among rows: the best pointing among those whose val rsum reaches --min-rsum."""
    from vlmatch.evaluation.pointing_stats import crossfit_choice

    rows = {}
    for name in a.rows:
        path = ROWS / f"{name}.json"
        if not path.is_file():
            sys.exit(f"grounding.py: {path} not found")
        r = read_row(path)
        if a.min_rsum is not None and (r.get("val_rsum") or 0) < a.min_rsum:
            print(f"{name}: val rsum {r.get('val_rsum')} below the floor {a.min_rsum}: not a candidate")
            continue
        rows[name] = r
    if not rows:
        sys.exit("grounding.py: no candidate reaches the rsum floor")
    try:
        out = crossfit_choice(rows)
    except ValueError as e:
        sys.exit(f"grounding.py: {e}")
    out = {"name": a.crossfit, "rows": list(a.rows), "candidates": list(rows), "min_rsum": a.min_rsum,
           "command": "python experiments/grounding.py " + shlex.join(sys.argv[1:]), **out}
    write_json(CHOICES / f"{a.crossfit}.json", out)
    print(json.dumps(out, indent=2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", help="the row's name (its JSON file's name)")
    ap.add_argument("--model", help="checkpoint folder or pretrained:NAME")
    ap.add_argument("--method", help="explanation method (default: the model's best)")
    ap.add_argument("--entities", default=str(ENTITIES))
    ap.add_argument("--phrase-as-query", action="store_true", help="attention/contribution: each phrase its own query")
    ap.add_argument("--mirror", action="store_true", help="each map the mean of the photo's and its mirror image's "
                                                          "(vlmatch.evaluation.mirror)")
    ap.add_argument("--max-images", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--note")
    ap.add_argument("--rerender", action="store_true", help="only rewrite grounding.md from the row files")
    ap.add_argument("--crossfit", metavar="NAME", help="a cross-fitted choice among --rows (written under this name)")
    ap.add_argument("--rows", nargs="+", default=[], help="with --crossfit: the candidate rows")
    ap.add_argument("--min-rsum", type=float, help="with --crossfit: only rows whose val rsum reaches this")
    a = ap.parse_args()
    if a.crossfit:
        crossfit(a)
    elif not a.rerender:
        if not (a.row and a.model):
            ap.error("--row and --model are needed (or --rerender)")
        run_row(a)
    rows = load_rows()
    write_text(RESULTS / "grounding.md", render(rows))
    write_text(BENCH_PAGE, render_seed_page(rows))
    print(f"wrote {RESULTS / 'grounding.md'} and {BENCH_PAGE}")


if __name__ == "__main__":
    main()
