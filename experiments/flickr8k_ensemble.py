"""Ensembles of Flickr8k runs: the mean of their val score matrices (SCAN's t-i + i-t ensemble, §4.3).

    python experiments/flickr8k_ensemble.py --name c22_scan_ensemble --members c22_scan_t2i_rerun c22_scan_i2t
    python experiments/flickr8k_ensemble.py --name c22_pair --members pretrained:scan-t2i-minilm-f8k c22_vsepp_minilm_decay

A member is a run of experiments/flickr8k.py (its checkpoint $VLMATCH_CACHE/runs/<run>/best) or a
shipped model (pretrained:NAME). Each member's val matrix (1000 images x 5000 captions) is scored once
and kept in $VLMATCH_CACHE/sims/; the record -- every member's recalls and the ensemble's, with this
command -- goes to experiments/results/flickr8k/<name>.json beside the runs, and the report
experiments/results/flickr8k.md is rendered again.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from flickr8k import RESULTS, RUNS, load_results, render

from vlmatch.evaluation.metrics import ensemble, evaluate_protocol, format_table
from vlmatch.evaluation.scoring import checkpoint_scores
from vlmatch.io import save_npy, write_json, write_text
from vlmatch_lab.caches import features_dir, features_of, runs_dir
from vlmatch_lab.inputs import need_features
from vlmatch_lab.paths import cache_root

CACHE = features_dir()  # the study's feature cache (Lite0, 224 px)
SIMS = cache_root() / "sims"


def member_checkpoint(member: str) -> str:
    if member.startswith("pretrained:"):
        return member
    best = runs_dir() / member / "best"
    if not (best / "model.safetensors").is_file():
        sys.exit(f"{best}: no checkpoint (train the run with experiments/flickr8k.py first)")
    return str(best)


def member_features(member: str) -> Path:
    """The val feature cache of the backbone and input size a member was trained on: ``CACHE`` (the study's
    Lite0 224 px) when its checkpoint does not say, or does not exist yet (the caller names what is missing)."""
    from vlmatch.errors import VlmatchError
    from vlmatch.models.registry import resolve_checkpoint

    best = runs_dir() / member / "best"
    try:
        ckpt = resolve_checkpoint(member) if member.startswith("pretrained:") else best
    except VlmatchError:
        return CACHE
    feats = features_of(ckpt) if Path(ckpt).is_dir() else CACHE
    return CACHE if feats == features_dir() else feats  # CACHE: the name this module's callers may point elsewhere


def member_sims(member: str) -> np.ndarray:
    path = SIMS / (member.replace(":", "_") + ".npy")
    if path.is_file():
        return np.load(path)
    sims = checkpoint_scores(member_checkpoint(member), str(member_features(member)), "dev", progress=True)
    save_npy(path, sims.astype(np.float32))
    return sims


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="record name (experiments/results/flickr8k/<name>.json)")
    ap.add_argument("--members", nargs="+", required=True, help="runs or pretrained:NAME, two or more")
    ap.add_argument("--note", help="a remark stored with the record")
    a = ap.parse_args(argv)
    if len(a.members) < 2:
        ap.error("an ensemble needs two or more --members")
    for m in a.members:  # every member's features, then its checkpoint, before the first is scored
        need_features(member_features(m))
    for m in a.members:
        member_checkpoint(m)
    mats = [member_sims(m) for m in a.members]
    members = {m: evaluate_protocol(s, "single", source=m) for m, s in zip(a.members, mats, strict=True)}
    res = evaluate_protocol(ensemble(mats, a.members), "single", source=a.name)
    print(format_table({**members, a.name: res}))
    cmd = ("python experiments/flickr8k_ensemble.py --name " + a.name + " --members " + " ".join(a.members)
           + (f" --note {shlex.quote(a.note)}" if a.note else ""))
    record = {"ensemble_of": a.members, "metrics": res, "members": members, "command": cmd,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **({"note": a.note} if a.note else {})}
    write_json(RUNS / f"{a.name}.json", record)
    write_text(RESULTS / "flickr8k.md", render(load_results()))


if __name__ == "__main__":
    main()
