"""Training curves of one run or several (``vlmatch plot RUN_DIR ... --out FILE.png``) from each run's
``metrics.jsonl``: loss, val rsum (a star at the best), and image->text and text->image recalls. The x axis counts
epochs completed (a validation after the first epoch sits at 1); a dotted line marks where hardest negatives start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DataError, VlmatchError
from ..io import atomic_path
from ..training.rundir import log_rows

RECALLS = ("r1", "r5", "r10")
STYLES = {"r1": "-", "r5": "--", "r10": ":"}


def read_log(run_dir) -> tuple[list[dict], list[dict]]:
    """(train records, val records) of a run folder's metrics.jsonl."""
    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file():
        if (run / "config.json").is_file() and (run.parent / "metrics.jsonl").is_file():
            raise DataError(run, f"a checkpoint folder; plot reads the run folder around it: {run.parent}")
        raise DataError(path, "not found (plot takes run folders written by `vlmatch train`)")
    records = [row for _, row in log_rows(path) if row is not None]  # (None: a last line still being written)
    train = [r for r in records if r.get("type") == "train"]
    val = [r for r in records if r.get("type") == "val"]
    if not train and not val:
        raise DataError(path, "no training or validation records yet")
    return train, val


def epoch_positions(train: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(global_step, epochs completed) of each training record."""
    steps_in = {}
    for r in train:
        steps_in[r["epoch"]] = max(steps_in.get(r["epoch"], 0), r["step"])
    gs = np.array([r["global_step"] for r in train], dtype=float)
    x = np.array([r["epoch"] + r["step"] / steps_in[r["epoch"]] for r in train], dtype=float)
    return gs, x


def run_curves(run_dir) -> dict:
    """The arrays one run contributes to the plot."""
    train, val = read_log(run_dir)
    gs, x = epoch_positions(train)
    if len(gs):
        vx = np.interp([r["global_step"] for r in val], gs, x)
    else:  # no training records (log_every larger than the run): place validations at epoch ends
        vx = np.array([r["epoch"] + 1.0 for r in val])
    # hardest negatives are switched on per epoch: mark the start of the first such epoch
    switch = next((float(r["epoch"]) for r in train if r.get("hardest")), None)
    if train and train[0].get("hardest"):
        switch = None  # hardest negatives from the start: nothing to mark
    return {"x": x, "loss": np.array([r["loss"] for r in train]), "val_x": np.asarray(vx),
            "val": {k: np.array([r[k] for r in val]) for k in
                    ["rsum"] + [f"{d}_{k}" for d in ("i2t", "t2i") for k in RECALLS]},
            "hardest_from": switch}


def run_labels(run_dirs) -> list[str]:
    """Folder names, or the paths as given when two runs share a name."""
    names = [Path(r).name for r in run_dirs]
    return names if len(set(names)) == len(names) else [str(r) for r in run_dirs]


def plot_runs(run_dirs, out) -> Path:
    """Draw the curves of ``run_dirs`` into the PNG ``out`` (written atomically); returns its path."""
    if not run_dirs:
        raise VlmatchError("plot needs at least one run folder")
    try:
        import matplotlib
    except ImportError:
        raise VlmatchError("plotting needs matplotlib: pip install 'vlmatch[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [run_curves(r) for r in run_dirs]
    labels = run_labels(run_dirs)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    (ax_loss, ax_rsum), (ax_i2t, ax_t2i) = axes
    for n, (c, label) in enumerate(zip(curves, labels, strict=True)):
        col = colours[n % len(colours)]
        if len(c["x"]):
            ax_loss.plot(c["x"], c["loss"], color=col, lw=1, label=label)
        if c["hardest_from"] is not None:
            ax_loss.axvline(c["hardest_from"], color=col, ls=":", lw=1)
        if len(c["val_x"]):
            rs = c["val"]["rsum"]
            ax_rsum.plot(c["val_x"], rs, "o-", color=col, ms=4, label=label)
            b = int(np.argmax(rs))
            ax_rsum.plot(c["val_x"][b], rs[b], "*", color=col, ms=14, mec="black",
                         label=f"best {rs[b]:.1f} (epoch {c['val_x'][b]:g})")
            for ax, d in ((ax_i2t, "i2t"), (ax_t2i, "t2i")):
                for k in RECALLS:
                    ax.plot(c["val_x"], c["val"][f"{d}_{k}"], STYLES[k], color=col, marker="o", ms=3,
                            label=f"{label} R@{k[1:]}")
    ax_loss.set_title("training loss (dotted: hardest negatives from here)")
    ax_rsum.set_title("validation rsum (star: best, the best/ checkpoint)")
    ax_i2t.set_title("validation image -> text recall (%)")
    ax_t2i.set_title("validation text -> image recall (%)")
    for ax in axes.flat:
        ax.set_xlabel("epochs completed")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    ax_loss.set_ylabel("loss (log scale)")
    if all(len(c["loss"]) and (c["loss"] > 0).all() for c in curves):
        ax_loss.set_yscale("log")  # the sum over negatives (warm-up) is ~batch size x the hardest-negative loss
    ax_rsum.set_ylabel("rsum (sum of six recalls, max 600)")
    ax_i2t.set_ylabel("R@K (%)")
    ax_t2i.set_ylabel("R@K (%)")
    fig.suptitle(" vs ".join(labels) if len(labels) <= 4 else f"{len(labels)} runs")
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out


def write_curves(run_dirs, out) -> Path | None:
    """``plot_runs`` when matplotlib is installed (None when it is not): the PNG written after training."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    try:
        return plot_runs(run_dirs, out)
    except DataError:  # e.g. a run stopped before it logged anything: nothing to draw
        return None
