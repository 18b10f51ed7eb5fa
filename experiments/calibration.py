"""Query-bank calibration (inverted softmax, QB-Norm's IS form; vlmatch.models.calibration) of a Flickr8k model on val.

    python experiments/calibration.py --model c36_vsepp_lite2_320_lora32 \
        --write ${VLMATCH_CACHE:-~/.cache/vlmatch}/calibration/default
    python experiments/calibration.py --model pretrained:vsepp-lite2-320-grounded-f8k --shipped-banks

``--model``: a run of experiments/flickr8k.py (its best checkpoint) or ``pretrained:NAME``. Encodes the
train split (the banks: 6,000 images, 30,000 captions) and val once (kept in $VLMATCH_CACHE/calibration/).
Every choice made on val is cross-fitted on its two halves (A: images 0-499 and their captions, B: images
500-999): beta is picked on A and reported on B, and picked on B and reported on A; the choice between the
text bank alone and both banks likewise (picked on A by A's best rsum, reported on B; picked on B, reported
on A). The held-out halves lead the table; all of val at the beta picked on A (the shipped one) follows, and
includes half A, so it is not held out. Settings:

- ``full``: every train caption and image as the banks, float32 (the method's own figure);
- ``shipped``: ``--rows`` random train captions (seed 0) in the ``--rank`` leading directions, int8 -- only
  the text bank, which calibrates the photos a search ranks;
- ``shipped + image bank``: the same with an image bank of ``--rows`` train images (captions calibrated too:
  the image-to-text direction, ``search --image``).

``--shipped-banks`` (with ``pretrained:NAME``): the banks are the ones the model ships (its
calibration.safetensors, made from train), so only val is encoded; the ``full`` setting is left out.

Every figure is Flickr8k val; the banks come from train only. The record goes to
experiments/results/calibration/<model>.json and the table experiments/results/calibration.md. ``--write DIR``
writes the ``shipped`` calibration there (calibration.safetensors + .json), ready for
``release/ship.py --calibration DIR``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vlmatch.evaluation.metrics import recall_metrics
from vlmatch.io import write_json, write_text
from vlmatch.models.calibration import Calibration
from vlmatch_lab.caches import features_of, runs_dir
from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root() / "calibration"
RESULTS = HERE / "results" / "calibration"
BETAS = (5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0)


def checkpoint_of(model: str) -> Path | str:
    if model.startswith("pretrained:"):
        return model
    best = runs_dir() / model / "best"
    if not (best / "model.safetensors").is_file():
        sys.exit(f"{best}: no checkpoint (train the run with experiments/flickr8k.py first)")
    return best


@torch.inference_mode()
def embeddings(model_name: str, splits=("train", "dev")) -> dict[str, np.ndarray]:
    """Uncalibrated unit embeddings of the images and captions of ``splits`` (cached)."""
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.models.registry import load_checkpoint, resolve_checkpoint

    path = CACHE / f"{model_name.replace(':', '_')}{'' if 'train' in splits else '_val'}.npz"
    if path.is_file():
        return dict(np.load(path))
    ckpt = resolve_checkpoint(checkpoint_of(model_name))
    model = load_checkpoint(ckpt).eval()
    model.calibration = None
    out = {}
    for split in splits:
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


def _rsum_curve(make, part) -> dict[float, float]:
    return {b: recall_metrics(calibrated(make(b), *part))["rsum"] for b in BETAS}


def _pick(curve: dict[float, float]) -> float:
    return max(curve, key=lambda b: (curve[b], -b))  # the best; the smaller beta of equals


def _figures(cal, part) -> dict:
    return {k: round(float(v), 2) for k, v in recall_metrics(calibrated(cal, *part)).items()}


def setting(e: dict, make, name: str, shipped_beta: float | None = None) -> dict:
    """Beta cross-fitted on the halves of val: picked on A (``beta``, the one shipped) and reported on B; picked on
    B (``beta_B``) and reported on A; ``held_out``: the mean of the two held-out rsums. ``val``: all of val at
    ``beta`` (half A included: not held out). ``shipped_beta``: a shipped calibration's beta, picked on half A
    when it was made: ``beta`` is that one (``beta_A_now``: the pick on A of these embeddings)."""
    parts = halves(e)
    curves = {h: _rsum_curve(make, parts[h]) for h in ("A", "B")}
    beta, beta_b = _pick(curves["A"]), _pick(curves["B"])
    now = beta
    if shipped_beta is not None:
        beta = shipped_beta
    cal = make(beta)
    out = {"setting": name, "beta": beta, "beta_B": beta_b,
           "curve_A": {str(b): round(v, 2) for b, v in curves["A"].items()},
           "curve_B": {str(b): round(v, 2) for b, v in curves["B"].items()},
           "B": _figures(cal, parts["B"]), "A": _figures(make(beta_b), parts["A"]), "val": _figures(cal, parts["val"])}
    out["held_out"] = round((out["B"]["rsum"] + out["A"]["rsum"]) / 2, 2)
    if shipped_beta is not None:
        out["beta_A_now"] = now
    out["cal"] = cal
    return out


def banks_cross_fit(text: dict, both: dict) -> dict:
    """The choice between the text bank alone and both banks, cross-fitted: chosen on half A by its best rsum
    there (at the beta picked on A) and reported on B; chosen on B, reported on A."""
    on_a = max((text, both), key=lambda s: max(s["curve_A"].values()))
    on_b = max((text, both), key=lambda s: max(s["curve_B"].values()))
    kind = {id(text): "text", id(both): "both"}
    return {"chosen_on_A": kind[id(on_a)], "B": on_a["B"]["rsum"], "chosen_on_B": kind[id(on_b)],
            "A": on_b["A"]["rsum"], "held_out": round((on_a["B"]["rsum"] + on_b["A"]["rsum"]) / 2, 2)}


def weights_of(model: str) -> str:
    """The SHA-256 of the weights of run ``model``'s checkpoint (what a written calibration is bound to)."""
    from vlmatch.checkpoints.read import read_checkpoint

    return read_checkpoint(checkpoint_of(model)).config["weights_sha256"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a run under $VLMATCH_CACHE/runs/, or pretrained:NAME")
    ap.add_argument("--rows", type=int, default=2048, help="rows of the shipped bank (random train items)")
    ap.add_argument("--rank", type=int, default=128, help="directions kept of the shipped bank")
    ap.add_argument("--write", type=Path, help="write the shipped calibration into this folder")
    ap.add_argument("--banks", choices=["text", "both"], default="text",
                    help="what --write keeps: the text bank only (calibrates images: search by text) or both banks")
    ap.add_argument("--shipped-banks", action="store_true",
                    help="with pretrained:NAME: cross-fit beta and the banks on the banks the model ships (encodes val only)")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    shipped_beta = None
    if a.shipped_banks:
        settings, ships, shipped_beta = _shipped_settings(a)
        e = embeddings(a.model, splits=("dev",))
    else:
        e = embeddings(a.model)
        settings, ships = _train_settings(a, e), a.banks
    index = len(settings) - (2 if ships == "text" else 1)  # the text-bank setting, then the one with both banks
    # a shipped beta was picked on half A for the setting that ships; the other setting's is picked on A here
    settings = [setting(e, make, name, shipped_beta if i == index else None) for i, (make, name) in enumerate(settings)]
    parts = halves(e)
    raw = {p: {k: round(float(v), 2) for k, v in recall_metrics(calibrated(None, *parts[p])).items()}
           for p in ("A", "B", "val")}
    shipped = settings[index]["cal"]
    args = sys.argv[1:] if argv is None else argv
    record = {"model": a.model, "command": "python experiments/calibration.py " + shlex.join(args),
              "uncalibrated": raw, "written": a.banks if a.write else None, "shipped_setting": index,
              "settings": [{k: v for k, v in s.items() if k != "cal"} for s in settings],
              "banks_cross_fit": banks_cross_fit(settings[-2], settings[-1]),
              "bank_bytes": _bytes(shipped), "seconds": round(time.perf_counter() - t0, 1),
              "host": {"cpu": cpu_model(), "flags": cpu_flags(), "torch": torch.__version__}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"{a.model.replace(':', '_')}.json", record)
    write_text(HERE / "results" / "calibration.md", render())
    print(table(record))
    if a.write:
        a.write.mkdir(parents=True, exist_ok=True)
        # bound to the weights whose embeddings the banks are: release/ship.py refuses it beside any other
        shipped.save(a.write, weights_sha256=weights_of(a.model))
        print(f"wrote {a.write}/calibration.safetensors ({(a.write / 'calibration.safetensors').stat().st_size / 1e6:.2f} MB), "
              f"beta {shipped.beta:g}")


def _train_settings(a, e: dict) -> list:
    """(make(beta) -> Calibration, name) of the three settings, banks drawn from the train embeddings."""
    tt, ti = torch.from_numpy(e["train_txt"]), torch.from_numpy(e["train_img"])
    rng = np.random.default_rng(0)
    rows_t = torch.from_numpy(np.sort(rng.choice(len(tt), min(a.rows, len(tt)), replace=False)))
    rows_i = torch.from_numpy(np.sort(rng.choice(len(ti), min(a.rows, len(ti)), replace=False)))
    src_t = f"{len(rows_t)} random Flickr8k train captions (seed 0)"
    src_i = f"{len(rows_i)} random Flickr8k train images (seed 0)"
    rank = min(a.rank, tt.shape[1])
    return [
        (lambda b: Calibration(b, tt, ti, {"text": {"rows": len(tt)}, "image": {"rows": len(ti)}}),
         f"full banks ({len(tt)} captions, {len(ti)} images, float32)"),
        (lambda b: Calibration.fit(b, rank, text=tt[rows_t], text_source=src_t),
         f"shipped: text bank {len(rows_t)} rows, rank {rank}, int8"),
        (lambda b: Calibration.fit(b, rank, text=tt[rows_t], image=ti[rows_i], text_source=src_t, image_source=src_i),
         f"shipped + image bank {len(rows_i)} rows, rank {rank}, int8"),
    ]


def _shipped_settings(a) -> tuple[list, str, float]:
    """The two settings of the banks a shipped model keeps (text bank alone; both), which it ships, its beta."""
    from vlmatch.models.registry import load_model

    if not a.model.startswith("pretrained:"):
        sys.exit("--shipped-banks takes --model pretrained:NAME")
    cal = load_model(a.model).calibration
    if cal is None or cal.text_bank is None:
        sys.exit(f"{a.model} ships no text bank to cross-fit")
    src, st = cal.sources, cal.stored
    text = cal.sources.get("text", {})
    settings = [(lambda b: Calibration(b, cal.text_bank, None, {"text": src["text"]}, {"text": st["text"]}),
                 f"shipped: text bank {text.get('rows')} rows, rank {text.get('rank')}, int8")]
    if cal.image_bank is not None:
        image = src.get("image", {})
        settings.append((lambda b: Calibration(b, cal.text_bank, cal.image_bank, src, st),
                         f"shipped + image bank {image.get('rows')} rows, rank {image.get('rank')}, int8"))
    return settings, "both" if cal.image_bank is not None else "text", cal.beta


def _bytes(cal: Calibration) -> int:
    return int(sum(t.numel() * t.element_size() for parts in cal.stored.values() for t in parts.values()))


def table(r: dict) -> str:
    u = r["uncalibrated"]
    crossed = "A" in u  # a cross-fitted record (older ones picked beta on A and reported B and all of val)
    lines = [f"### {r['model']}", "", f"`{r['command']}`", ""]
    if crossed:
        lines += ["| setting | beta picked on A | **half B rsum** (held out) | beta picked on B | **half A rsum** (held out) "
                  "| held-out mean | val rsum at beta A (A not held out) | t2i R@1 | i2t R@1 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
                  f"| uncalibrated | - | {u['B']['rsum']:.2f} | - | {u['A']['rsum']:.2f} | "
                  f"{(u['A']['rsum'] + u['B']['rsum']) / 2:.2f} | {u['val']['rsum']:.2f} | {u['val']['t2i_r1']:.2f} | "
                  f"{u['val']['i2t_r1']:.2f} |"]
        for s in r["settings"]:
            v = s["val"]
            lines.append(f"| {s['setting']} | {s['beta']:g} | **{s['B']['rsum']:.2f}** | {s['beta_B']:g} | "
                         f"**{s['A']['rsum']:.2f}** | {s['held_out']:.2f} | {v['rsum']:.2f} | {v['t2i_r1']:.2f} | "
                         f"{v['i2t_r1']:.2f} |")
        c = r["banks_cross_fit"]
        names = {"text": "the text bank alone", "both": "both banks"}
        lines += ["", f"Banks cross-fitted: chosen on half A, {names[c['chosen_on_A']]}, reads **{c['B']:.2f}** on half B; "
                      f"chosen on half B, {names[c['chosen_on_B']]}, reads **{c['A']:.2f}** on half A (held-out mean "
                      f"{c['held_out']:.2f}, uncalibrated {(u['A']['rsum'] + u['B']['rsum']) / 2:.2f})."]
    else:
        lines += ["| setting | beta (half A) | half B rsum | val rsum | t2i R@1 | t2i R@10 | i2t R@1 | i2t R@10 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|",
                  f"| uncalibrated | - | {u['B']['rsum']:.2f} | {u['val']['rsum']:.2f} | {u['val']['t2i_r1']:.2f} | "
                  f"{u['val']['t2i_r10']:.2f} | {u['val']['i2t_r1']:.2f} | {u['val']['i2t_r10']:.2f} |"]
        for s in r["settings"]:
            v = s["val"]
            lines.append(f"| {s['setting']} | {s['beta']:g} | {s['B']['rsum']:.2f} | {v['rsum']:.2f} | "
                         f"{v['t2i_r1']:.2f} | {v['t2i_r10']:.2f} | {v['i2t_r1']:.2f} | {v['i2t_r10']:.2f} |")
        lines += ["", "(Not cross-fitted: beta picked on half A, reported on half B and on all of val, which includes A; "
                      "the banks were chosen looking at all of val.)"]
    kept = {"text": "the text bank", "both": "both banks"}.get(r.get("written") or "", "nothing (not written)")
    if r.get("written") is None and "shipped_setting" in r:
        kept = f"nothing (the model's own banks: {r['settings'][r['shipped_setting']]['setting']})"
    lines += ["", f"Written: {kept}, {r['bank_bytes'] / 1e6:.2f} MB; {r['seconds']:.0f} s; "
                  f"host {r['host'].get('cpu', '')}, {' '.join(r['host'].get('flags', []))}.", ""]
    return "\n".join(lines)


def render() -> str:
    import json

    head = ["# Query-bank calibration on Flickr8k val", "",
            "Inverted softmax in QB-Norm's IS form, both directions (`vlmatch.models.calibration`): each image's score "
            "minus its offset against a bank of training captions, each caption's minus its offset against a bank of "
            "training images; the banks are train only. Every choice made on val is cross-fitted on its halves (A: "
            "images 0-499 with their captions, B: 500-999): beta picked on A is reported on B and beta picked on B on "
            "A, and the choice of banks likewise; the held-out halves lead, all of val (which includes A) follows. "
            "`python experiments/calibration.py --model M` (doc at the top of the script).", ""]
    body = [table(json.loads(p.read_text())) for p in sorted(RESULTS.glob("*.json"))]
    return "\n".join(head + body)


if __name__ == "__main__":
    main()
