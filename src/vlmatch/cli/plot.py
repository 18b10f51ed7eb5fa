"""``vlmatch plot``."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("plot", help="loss and validation recall curves of one run or several (PNG)",
                       description="Draw the training loss, validation rsum and R@1/5/10 (both directions) of "
                                   "one run folder or several side by side into a PNG. x = epochs completed.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    p.add_argument("--out", metavar="FILE.png", help="output PNG (default RUN_DIR/curves.png for one run, "
                                                     "curves.png for several)")
    p.set_defaults(func=cmd_plot)


def cmd_plot(a):
    from ..io import check_writable
    from ..viz.curves import plot_runs

    out = a.out or (Path(a.runs[0]) / "curves.png" if len(a.runs) == 1 else "curves.png")
    check_writable(out)
    print(f"wrote {plot_runs(a.runs, out)}")
