"""Run folders: one run per folder, one writer at a time (the folder's ``.vlmatch.lock``). A fresh run refuses a
folder holding a run unless ``overwrite`` (which removes only the run's entries); a resume must be the run its
checkpoint was made by (:data:`vlmatch.training.config.RESUMABLE_CHANGES` may differ) at a step it could reach.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

from ..checkpoints.read import EDITED
from ..errors import ConfigError, DataError
from ..io import complete_dir, writer_lock
from .config import RESUMABLE_CHANGES

RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "last", "last.prev", "best", "best.prev", "ranks")


def run_entries(run_dir: Path) -> list[Path]:
    """The entries of ``run_dir`` that belong to a run (including stale checkpoint temporaries)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [run_dir / n for n in RUN_ENTRIES if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    return found + sorted(p for n in ("last", "best") for p in run_dir.glob(f".{n}.*.tmp"))


def prepare_fresh(run_dir: Path, overwrite: bool = False) -> None:
    """Make ``run_dir`` ready for a new run: refuse one that holds a run, or clear it if ``overwrite``."""
    entries = run_entries(run_dir)
    if entries and not overwrite:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:4])
        raise ConfigError(f"{run_dir} already holds a run ({names}); continue it with `vlmatch train --resume "
                          f"{run_dir}`, choose another --run-dir, or pass --overwrite to delete that run")
    for p in entries:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    Path(run_dir).mkdir(parents=True, exist_ok=True)


def run_lock(run_dir, resume: bool = False):
    """The run folder's writer lock (:func:`vlmatch.io.writer_lock`); a fresh run creates the folder
    first, a resumed one must find it."""
    run_dir = Path(run_dir)
    if resume and not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    return writer_lock(run_dir, "vlmatch train", "wait for it to finish, or stop it first (one training run per "
                                                 "run folder at a time)")


def start_over(run_dir) -> bool:
    """``--resume`` of a run killed before its first ``last/``: started over from step 1 (returns False), unless a
    ``best/`` of a later epoch than the first shows last/ was lost some other way (refused: it would be deleted)."""
    run_dir = Path(run_dir)
    for best in (run_dir / "best", run_dir / "best.prev"):
        if not best.exists():
            continue
        epoch = _epoch_of(best)
        if epoch != 0:
            at = "of an unknown epoch" if epoch is None else f"of epoch {epoch + 1}"
            raise ConfigError(f"--resume {run_dir}: no last/ checkpoint in it to continue from ({best.name}/ is there, "
                              f"{at}; last/ is not): start the run over with `vlmatch train --config "
                              f"{run_dir / 'config.yaml'} --run-dir {run_dir} --overwrite`")
    print(f"vlmatch: note: --resume {run_dir}: the run stopped before its first checkpoint (no last/): starting it "
          "over from step 1", file=sys.stderr)
    return False


def _epoch_of(best: Path) -> int | None:
    """The 0-based epoch of a ``best/`` checkpoint (its metrics.json), None when it does not say."""
    try:
        epoch = json.loads((best / "metrics.json").read_text(encoding="utf-8")).get("epoch")
    except (OSError, ValueError, AttributeError):
        return None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def recorded(cfg: dict) -> dict:
    """The configuration saved with a run: ``train.stop_after_steps`` is a one-off, never saved."""
    out = copy.deepcopy(cfg)
    out["train"]["stop_after_steps"] = None
    return out


def check_resume(saved: dict | None, cfg: dict, run_dir) -> None:
    """Refuse to resume when the checkpoint's configuration differs from ``cfg`` in what it computes."""
    if saved is None:  # a checkpoint from before configurations were recorded: nothing to compare
        return
    a, b = _plain(saved), _plain(cfg)
    diffs = []
    for section in sorted(set(a) | set(b)):
        sa, sb = a.get(section) or {}, b.get(section) or {}
        for key in sorted(set(sa) | set(sb)):
            if (section, key) not in RESUMABLE_CHANGES and sa.get(key) != sb.get(key):
                diffs.append(f"{section}.{key}: {sa.get(key)!r} in the checkpoint, {sb.get(key)!r} now")
    if diffs:
        more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise ConfigError(f"--resume {run_dir}: the checkpoint in last/ was made with another configuration: "
                          f"{'; '.join(diffs[:3])}{more}. Resume with the run's own config, or start a new run")


def _plain(cfg: dict) -> dict:
    return json.loads(json.dumps(cfg))


# --- what a resume checks: the trainer state of last/ against this run's steps and log -------------------

def check_steps(path, state: dict, steps_per_epoch: list[int]) -> None:
    """Refuse counters this run cannot reach: ``step_in_epoch`` past an epoch's end, or a ``global_step`` outside
    the epochs done (1 to ``max(steps_per_epoch)`` steps each: the world size may change between resumes)."""
    epoch, step, gs = state["epoch"], state["step_in_epoch"], state["global_step"]
    if step > steps_per_epoch[-1]:
        raise DataError(path, f"step_in_epoch is {step}, but an epoch of this run has {steps_per_epoch[-1]} steps "
                              f"{EDITED}")
    lo, hi = epoch + step, epoch * max(steps_per_epoch) + step
    if not lo <= gs <= hi:
        span = f"{lo}" if lo == hi else f"between {lo} and {hi}"
        raise DataError(path, f"global_step is {gs}, but epoch {epoch} and step_in_epoch {step} of this run make it "
                              f"{span} {EDITED}")


def latest_checkpoint(run_dir) -> Path | None:
    return complete_dir(Path(run_dir) / "last")


def log_rows(path) -> list[tuple[str, dict | None]]:
    """(line, row) of each row of a run's ``metrics.jsonl`` (row None: a last line torn by a kill); a malformed
    row before the last is a DataError."""
    path = Path(path)
    if not path.exists():
        return []
    if not path.is_file():
        raise DataError(path, "is not a file (the run's log, metrics.jsonl, must be one): move it away, or start "
                              "the run over with --overwrite")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines):  # torn by the kill that interrupted the run
                rows.append((line, None))
                continue
            row = None
        step = row.get("global_step", 0) if isinstance(row, dict) else None
        if not isinstance(step, int):
            raise DataError(path, f"line {no} is not a row vlmatch train wrote (not a JSON object with an integer "
                                  "global_step): restore the file or start the run over with --overwrite")
        rows.append((line, row))
    return rows


def check_log(path, state: dict, metrics_path) -> None:
    """Refuse a trainer state that disagrees with the run's log: ``global_step`` must be where the log ends the last
    finished epoch plus ``step_in_epoch``, ``best_rsum`` / ``best_epoch`` the best validation row up to it."""
    rows = [r for _, r in log_rows(metrics_path) if r is not None and r["global_step"] <= state["global_step"]]
    if not Path(metrics_path).is_file():
        return
    epoch, step, gs = state["epoch"], state["step_in_epoch"], state["global_step"]
    val = [r for r in rows if r.get("type") == "val" and isinstance(r.get("rsum"), (int, float))]
    start = 0
    if epoch > 0:
        ends = [r for r in val if r.get("epoch") == epoch - 1]
        if not ends:
            raise DataError(path, f"epoch is {epoch}, but {metrics_path} has no validation of epoch {epoch - 1} up to "
                                  f"global_step {gs}: the run never finished that epoch {EDITED}")
        start = ends[-1]["global_step"]
    if gs != start + step:
        raise DataError(path, f"global_step is {gs}, but {metrics_path} ends epoch {epoch - 1} at step {start} and "
                              f"step_in_epoch is {step}: it must be {start + step} {EDITED}")
    best = max(val, key=lambda r: r["rsum"], default=None)  # the first of equals, as the trainer keeps it
    if best is None:
        if state.get("best_epoch") is not None:
            raise DataError(path, f"best_epoch is {state['best_epoch']}, but {metrics_path} has no validation row "
                                  f"up to global_step {gs} {EDITED}")
        return
    if abs(state["best_rsum"] - best["rsum"]) > 1e-9 or state.get("best_epoch") != best.get("epoch"):
        raise DataError(path, f"best_rsum is {state['best_rsum']!r} (best_epoch {state.get('best_epoch')}), but the "
                              f"best validation in {metrics_path} is {best['rsum']!r} at epoch {best.get('epoch')} "
                              f"{EDITED}")
