"""Toy-world benchmark: the quickstart recipe for every model family, test-split recalls.

    python experiments/toyworld.py            # vsepp, SCAN t-i AVG, SCAN i-t AVG, CAAN

Writes experiments/results/toyworld.{json,md}. The toy world is built so that word-region
attention matters (see vlmatch.data.synth): SCAN must clearly beat the global VSE++ there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vlmatch.cli.quickstart import quickstart
from vlmatch.evaluation.metrics import format_table
from vlmatch.io import write_text
from vlmatch_lab.caches import runs_dir

HERE = Path(__file__).resolve().parent
CONFIGS = ["quickstart_vsepp", "quickstart_scan", "quickstart_scan_i2t", "quickstart_caan"]


def main(argv=None):
    configs = (argv if argv is not None else sys.argv[1:]) or CONFIGS
    out = HERE / "results" / "toyworld"
    results = quickstart(runs_dir() / "toyworld", out.with_suffix(".json"), configs)  # the rooms' one cache
    md = ["# Toy world (bundled synthetic data), test split: 1000 images, 5000 captions", "",
          "Each model trained with its `configs/quickstart_*.yaml` recipe on 2 CPU cores; best epoch by dev rsum.", "",
          "```", format_table(results), "```", "",
          f"Command: `python experiments/toyworld.py {' '.join(configs)}`", ""]
    write_text(out.with_suffix(".md"), "\n".join(md))


if __name__ == "__main__":
    main()
