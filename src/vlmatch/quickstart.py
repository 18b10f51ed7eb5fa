"""``vlmatch quickstart``: generate the toy world, train VSE++ and SCAN briefly, print their test recalls."""

from __future__ import annotations

import time
from pathlib import Path

from .config import load_config
from .data.precomp import PrecompSplit
from .io import write_json
from .metrics import evaluate_protocol, format_table
from .models.registry import load_model
from .scoring import model_scores
from .train import data_root, train

DEFAULT_MODELS = ("quickstart_vsepp", "quickstart_scan")


def quickstart(run_dir="runs/quickstart", json_path=None, configs=None) -> dict:
    configs = list(configs or DEFAULT_MODELS)
    results, timings = {}, {}
    for name in configs:
        cfg = load_config(name)
        out = Path(run_dir) / Path(name).stem
        print(f"== training {cfg['model']['name']} ({name}) for {cfg['train']['epochs']} epochs on the toy world")
        t0 = time.time()
        train(cfg, out, overwrite=True)  # the demo's own folders: a rerun starts afresh
        timings[name] = time.time() - t0
        model = load_model(out / "best")
        test = PrecompSplit(data_root(cfg["data"]["path"]), "test")
        sims = model_scores(model, test)
        results[cfg["model"]["name"]] = evaluate_protocol(sims, "single", source=test.captions_path)
    print("\ntoy world, test split (1000 images, 5000 captions):")
    print(format_table(results))
    print("training wall time: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    if json_path:
        write_json(json_path, {"data": "toyworld/test", "results": results, "train_seconds": timings})
    return results
