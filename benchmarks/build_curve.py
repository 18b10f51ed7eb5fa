"""Index build speed from JPEG folders for each image backbone and input size (issue "Search quality", item 2):
the x axis of the curve val rsum vs build images/s that picks the default pair.

    python benchmarks/build_curve.py --images 200                 # every point, this host's own vector units
    python benchmarks/build_curve.py --images 200 --isa avx2      # the same, kernels held to AVX2 (see below)
    python benchmarks/build_curve.py --rerender                   # only rewrite build_curve.md

Each point (EfficientNet-Lite0 / 1 / 2 at 224 / 320 / 448 px) runs in its own process: ``build_index`` on a
folder of Flickr8k val JPEGs with a pair of the default pair's shape (VSE++ retriever + SCAN t-i re-scorer,
frozen MiniLM, the backbone's width; untrained weights: the work is the same) -- JPEG decode and resize, the
backbone, both models' image encodings, the float16 store, the FAISS index and the commit, as
``vlmatch index build --images DIR`` does. The rate is the steady one: (N - 16) / (t(N) - t(16)) from two
builds in one process, so loading the backbone and the text encoder (a one-off per process, given apart as
``startup_s``) does not count against a large build.

``--isa avx2`` holds torch's own kernels (``ATEN_CPU_CAPABILITY=avx2``), oneDNN's convolutions
(``ONEDNN_MAX_CPU_ISA=AVX2``) and MKL (``MKL_ENABLE_INSTRUCTIONS=AVX2``) to AVX2 on an AVX-512 host: the
instructions of an AVX2-only host, not its clock or caches, so it is an estimate of such a host that the
results file marks as such; a run on a real AVX2-only host records ``native`` with that host's flags.
Results: benchmarks/results/build_curve.json (one row per isa, backbone and size; a re-run replaces its
rows) and build_curve.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import data_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
BACKBONES = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
SIZES = (224, 320, 384, 448)
WARM = 16
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
GOAL = 20.0  # images/s on 2 cores of an AVX2-only host (the floor for the default pair)


def _pair(tmp: Path, backbone: str, size: int) -> tuple[Path, Path | None]:
    """Untrained checkpoints of the shipped default's models (re-scorer or single model, and the retriever or None)
    with their options on ``backbone`` at ``size``."""
    from vlmatch import create_model, pretrained
    from vlmatch.checkpoints.seal import seal_checkpoint
    from vlmatch.features.backbones import create_backbone
    from vlmatch.io import write_json

    bb = create_backbone(backbone, None, size)
    out = []
    for name in pretrained.default_pair():
        if name is None:  # a default that is its own stage 1
            out.append(None)
            continue
        entry = pretrained.get(name)
        d = create_model(entry.model, **{**entry.config, "img_dim": bb.info.dim}).save(tmp / name)
        write_json(d / "backbone.json", bb.describe())
        seal_checkpoint(d)  # backbone.json is part of the checkpoint: sealed with it
        out.append(d)
    return out[0], out[1]


def one(backbone: str, size: int, n: int) -> dict:
    """Build twice in this process (WARM then n images) and time both."""
    import torch

    from vlmatch.search.build import build_index

    names = [im["filename"] for im in json.loads((SHARED / "dataset_flickr8k.json").read_text())["images"]
             if im["split"] == "val"][:n]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model, retriever = _pair(tmp, backbone, size)
        times = {}
        for count in (WARM, n):
            folder = tmp / f"jpegs{count}"
            folder.mkdir()
            for name in names[:count]:
                (folder / name).symlink_to((SHARED / "images" / name).resolve())
            t0 = time.perf_counter()
            build_index(tmp / f"index{count}", model, images=folder, retriever_ckpt=retriever, progress=False)
            times[count] = time.perf_counter() - t0
            shutil.rmtree(tmp / f"index{count}")
    rate = (n - WARM) / (times[n] - times[WARM])
    return {"backbone": backbone, "input_size": size, "grid": size // 32, "images": n,
            "seconds": round(times[n], 2), "images_per_s": round(rate, 1),
            "startup_s": round(max(0.0, times[WARM] - WARM / rate), 2), "threads": torch.get_num_threads()}


def _load() -> dict:
    p = RESULTS / "build_curve.json"
    return json.loads(p.read_text()) if p.is_file() else {"rows": []}


def render(res: dict) -> str:
    lines = ["# Index build speed by image backbone and input size", "",
             "`python benchmarks/build_curve.py --images N [--isa avx2]`: `build_index` from a folder of Flickr8k val "
             "JPEGs with untrained models of the shipped default's shape on each backbone and input size (the rows "
             "below: the first pair's, VSE++ retriever + SCAN t-i re-scorer; the default is now one VSE++, less "
             "work); decode, resize, backbone, the encodings, store, FAISS and commit included. Steady rate "
             f"over N - {WARM} images (the one-off load of the backbone and text encoder apart). `avx2`: kernels held "
             "to AVX2 on an AVX-512 host (an estimate of an AVX2-only host); `native`: the host's own. The default "
             f"pair must build at >= {GOAL:.0f} images/s on an AVX2-only host.", "",
             "| isa | backbone | input | grid | images/s | startup s | images | threads | host |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(res["rows"], key=lambda r: (r["isa"], r["backbone"], r["input_size"])):
        ok = "" if r["images_per_s"] >= GOAL else " (below 20)"
        lines.append(f"| {r['isa']} | {r['backbone']} | {r['input_size']} | {r['grid']} x {r['grid']} | "
                     f"{r['images_per_s']:.1f}{ok} | {r['startup_s']:.1f} | {r['images']} | {r['threads']} | "
                     f"{r['host']['cpu']}; {'AVX-512' if 'avx512f' in r['host']['flags'] else 'AVX2'} |")
    for isa in sorted({r["isa"] for r in res["rows"]}):
        rows = {(r["backbone"], r["input_size"]): r["images_per_s"] for r in res["rows"] if r["isa"] == isa}
        sizes = sorted({s for _, s in rows})
        lines += ["", f"{isa}, images/s (bold: >= {GOAL:.0f}):", "",
                  "| backbone | " + " | ".join(f"{s} px" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for b in sorted({b for b, _ in rows}):
            cells = [rows.get((b, s)) for s in sizes]
            lines.append(f"| {b} | " + " | ".join("-" if c is None else f"**{c:.1f}**" if c >= GOAL else f"{c:.1f}"
                                                   for c in cells) + " |")
    notes = sorted({r.get("note", "") for r in res["rows"]} - {""}) + res.get("notes", [])  # rows', then the file's
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--isa", choices=("native", "avx2"), default="native")
    ap.add_argument("--points", default="", help="backbone:size,... (default: every one)")
    ap.add_argument("--note", default="")
    ap.add_argument("--rerender", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("BACKBONE", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.images)))
        return
    from vlmatch.io import write_json

    res = _load()
    if not a.rerender:
        if a.images <= WARM:
            sys.exit(f"--images must be more than {WARM}")
        points = [(b, s) for b in BACKBONES for s in SIZES]
        if a.points:
            points = [(p.split(":")[0], int(p.split(":")[1])) for p in a.points.split(",")]
        env = {**os.environ, **(AVX2_ENV if a.isa == "avx2" else {})}
        for b, s in points:
            out = subprocess.run([sys.executable, __file__, "--one", b, str(s), "--images", str(a.images)],
                                 env=env, capture_output=True, text=True)
            if out.returncode:
                why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit status {out.returncode}"
                sys.exit(f"{b} at {s}: {why}")
            row = {**json.loads(out.stdout.strip().splitlines()[-1]), "isa": a.isa,
                   "host": {"cpu": cpu_model(), "flags": cpu_flags()},
                   "command": "python benchmarks/build_curve.py " + " ".join(argv or sys.argv[1:]),
                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
            if a.note:
                row["note"] = a.note
            print(f"{a.isa:6s} {b} {s}: {row['images_per_s']:.1f} images/s (startup {row['startup_s']:.1f} s)",
                  flush=True)
            res["rows"] = [r for r in res["rows"] if (r["isa"], r["backbone"], r["input_size"]) != (a.isa, b, s)]
            res["rows"].append(row)
            write_json(RESULTS / "build_curve.json", res)
    (RESULTS / "build_curve.md").write_text(render(res))
    print(render(res))


if __name__ == "__main__":
    main()
