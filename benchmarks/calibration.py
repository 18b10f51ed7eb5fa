"""Query-bank calibration (dual inverted softmax, vlmatch.models.calibration) of a Flickr8k model on val.

    python benchmarks/calibration.py --model c36_vsepp_lite2_320_lora32 --write benchmarks/cache/calibration/default

``--model``: a run of benchmarks/flickr8k.py (its best checkpoint) or ``pretrained:NAME``. Encodes the
train split (the banks: 6,000 images, 30,000 captions) and val once (kept in benchmarks/cache/calibration/),
then for each bank setting picks beta on val half A (images 0-499 and their captions) and reports val half B
(images 500-999) and the whole of val (1,000 x 5,000) at that beta:

- ``full``: every train caption and image as the banks, float32 (the method's own figure);
- ``shipped``: ``--rows`` random train captions (seed 0) in the ``--rank`` leading directions, int8 -- only
  the text bank, which calibrates the photos a search ranks;
- ``shipped + image bank``: the same with an image bank of ``--rows`` train images (captions calibrated too:
  the image-to-text direction, ``search --image``).

Every figure is Flickr8k val; the banks come from train only. The record goes to
benchmarks/results/calibration/<model>.json and the table benchmarks/results/calibration.md. ``--write DIR``
writes the ``shipped`` calibration there (calibration.safetensors + .json), ready for
``benchmarks/ship.py --calibration DIR``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from flickr8k import HERE, features_of
from hostinfo import cpu_flags, cpu_model

from vlmatch.evaluation.metrics import recall_metrics
from vlmatch.io import write_json, write_text
from vlmatch.models.calibration import Calibration

CACHE = HERE / "cache" / "calibration"
RESULTS = HERE / "results" / "calibration"
BETAS = (5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0)


def checkpoint_of(model: str) -> Path | str:
    if model.startswith("pretrained:"):
        return model
    best = HERE / "cache" / "runs" / model / "best"
    if not (best / "model.safetensors").is_file():
        sys.exit(f"{best}: no checkpoint (train the run with benchmarks/flickr8k.py first)")
    return best


@torch.inference_mode()
def embeddings(model_name: str) -> dict[str, np.ndarray]:
    """Uncalibrated unit embeddings of train and val images and captions (cached)."""
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.models.registry import load_checkpoint, resolve_checkpoint

    path = CACHE / f"{model_name.replace(':', '_')}.npz"
    if path.is_file():
        return dict(np.load(path))
    ckpt = resolve_checkpoint(checkpoint_of(model_name))
    model = load_checkpoint(ckpt).eval()
    model.calibration = None
    out = {}
    for split in ("train", "dev"):
        sp = PrecompSplit(features_of(ckpt), split)
        f = sp.features
        out[f"{split}_img"] = torch.cat([model.encode_images(torch.from_numpy(np.asarray(f[a:a + 250], np.float32))).embedding
                                         for a in range(0, len(f), 250)]).numpy()
        parts = []
        for a in range(0, len(sp.captions), 500):
            parts.append(model.encode_texts(*model.tokenize(sp.captions[a:a + 500])).embedding)
            print(f"\r{split} captions {a + 500}/{len(sp.captions)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        out[f"{split}_txt"] = torch.cat(parts).numpy()
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, **out)
    return out


def calibrated(cal: Calibration | None, img: np.ndarray, txt: np.ndarray) -> np.ndarray:
    s = img @ txt.T
    if cal is None:
        return s
    ti, tt = torch.from_numpy(img), torch.from_numpy(txt)
    for off, axis in ((cal.image_offsets(ti), 1), (cal.text_offsets(tt), 0)):
        if off is not None:
            s = s - np.expand_dims(off.numpy(), axis)
    return s


def halves(e: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    vi, vt = e["dev_img"], e["dev_txt"]
    per = len(vt) // len(vi)
    h = len(vi) // 2
    return {"A": (vi[:h], vt[:h * per]), "B": (vi[h:], vt[h * per:]), "val": (vi, vt)}


def setting(e: dict, make, name: str) -> dict:
    """Beta picked on half A; recalls of half B and of all val at it (and the curve on A)."""
    parts = halves(e)
    curve = {b: recall_metrics(calibrated(make(b), *parts["A"]))["rsum"] for b in BETAS}
    beta = max(curve, key=lambda b: (curve[b], -b))
    cal = make(beta)
    out = {"setting": name, "beta": beta, "curve_A": {str(b): round(v, 2) for b, v in curve.items()}}
    for part in ("B", "val"):
        m = recall_metrics(calibrated(cal, *parts[part]))
        out[part] = {k: round(float(v), 2) for k, v in m.items()}
    out["cal"] = cal
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a run under benchmarks/cache/runs/, or pretrained:NAME")
    ap.add_argument("--rows", type=int, default=2048, help="rows of the shipped bank (random train items)")
    ap.add_argument("--rank", type=int, default=128, help="directions kept of the shipped bank")
    ap.add_argument("--write", type=Path, help="write the shipped calibration into this folder")
    ap.add_argument("--banks", choices=["text", "both"], default="text",
                    help="what --write keeps: the text bank only (calibrates images: search by text) or both banks")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    e = embeddings(a.model)
    tt, ti = torch.from_numpy(e["train_txt"]), torch.from_numpy(e["train_img"])
    rng = np.random.default_rng(0)
    rows_t = torch.from_numpy(np.sort(rng.choice(len(tt), min(a.rows, len(tt)), replace=False)))
    rows_i = torch.from_numpy(np.sort(rng.choice(len(ti), min(a.rows, len(ti)), replace=False)))
    src_t = f"{len(rows_t)} random Flickr8k train captions (seed 0)"
    src_i = f"{len(rows_i)} random Flickr8k train images (seed 0)"
    rank = min(a.rank, tt.shape[1])
    settings = [
        setting(e, lambda b: Calibration(b, tt, ti, {"text": {"rows": len(tt)}, "image": {"rows": len(ti)}}),
                f"full banks ({len(tt)} captions, {len(ti)} images, float32)"),
        setting(e, lambda b: Calibration.fit(b, rank, text=tt[rows_t], text_source=src_t),
                f"shipped: text bank {len(rows_t)} rows, rank {rank}, int8"),
        setting(e, lambda b: Calibration.fit(b, rank, text=tt[rows_t], image=ti[rows_i], text_source=src_t,
                                             image_source=src_i),
                f"shipped + image bank {len(rows_i)} rows, rank {rank}, int8"),
    ]
    parts = halves(e)
    raw = {p: {k: round(float(v), 2) for k, v in recall_metrics(calibrated(None, *parts[p])).items()}
           for p in ("B", "val")}
    shipped = settings[1 if a.banks == "text" else 2]["cal"]
    args = sys.argv[1:] if argv is None else argv
    record = {"model": a.model, "command": "python benchmarks/calibration.py " + shlex.join(args),
              "uncalibrated": raw, "written": a.banks if a.write else None,
              "settings": [{k: v for k, v in s.items() if k != "cal"} for s in settings],
              "bank_bytes": _bytes(shipped), "seconds": round(time.perf_counter() - t0, 1),
              "host": {"cpu": cpu_model(), "flags": cpu_flags(), "torch": torch.__version__}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"{a.model.replace(':', '_')}.json", record)
    write_text(HERE / "results" / "calibration.md", render())
    print(table(record))
    if a.write:
        a.write.mkdir(parents=True, exist_ok=True)
        shipped.save(a.write)
        print(f"wrote {a.write}/calibration.safetensors ({(a.write / 'calibration.safetensors').stat().st_size / 1e6:.2f} MB), "
              f"beta {shipped.beta:g}")


def _bytes(cal: Calibration) -> int:
    return int(sum(t.numel() * t.element_size() for parts in cal.stored.values() for t in parts.values()))


def table(r: dict) -> str:
    lines = [f"### {r['model']}", "", f"`{r['command']}`", "",
             "| setting | beta (half A) | half B rsum | val rsum | t2i R@1 | t2i R@10 | i2t R@1 | i2t R@10 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    u = r["uncalibrated"]
    lines.append(f"| uncalibrated | - | {u['B']['rsum']:.2f} | {u['val']['rsum']:.2f} | {u['val']['t2i_r1']:.2f} | "
                 f"{u['val']['t2i_r10']:.2f} | {u['val']['i2t_r1']:.2f} | {u['val']['i2t_r10']:.2f} |")
    for s in r["settings"]:
        v = s["val"]
        lines.append(f"| {s['setting']} | {s['beta']:g} | {s['B']['rsum']:.2f} | **{v['rsum']:.2f}** | {v['t2i_r1']:.2f} | "
                     f"{v['t2i_r10']:.2f} | {v['i2t_r1']:.2f} | {v['i2t_r10']:.2f} |")
    kept = {"text": "the text bank", "both": "both banks"}.get(r.get("written") or "", "nothing (not written)")
    lines += ["", f"Shipped with the model: {kept}, {r['bank_bytes'] / 1e6:.2f} MB; {r['seconds']:.0f} s; "
                  f"host {r['host'].get('cpu', '')}, {' '.join(r['host'].get('flags', []))}.", ""]
    return "\n".join(lines)


def render() -> str:
    import json

    head = ["# Query-bank calibration on Flickr8k val", "",
            "Dual inverted softmax (`vlmatch.models.calibration`): each image's score minus its offset against a bank of "
            "training captions, each caption's minus its offset against a bank of training images. Beta is picked on val "
            "half A (images 0-499 with their captions) and reported on half B and on all of val; the banks are train "
            "only. `python benchmarks/calibration.py --model M` (doc at the top of the script).", ""]
    body = [table(json.loads(p.read_text())) for p in sorted(RESULTS.glob("*.json"))]
    return "\n".join(head + body)


if __name__ == "__main__":
    main()
