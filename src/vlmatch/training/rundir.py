"""Run folders: one run per folder, never mixed.

A fresh run refuses a folder that already holds a run (``config.yaml``, ``metrics.jsonl``, ``last/``,
``best/`` ...) unless told to ``overwrite`` it, which removes only those entries (never other files
the user keeps there). A resumed run must be the run the checkpoint was made by: the configuration
saved in ``last/trainer_state.json`` is compared with the one resumed with, and only options that do
not change what is computed may differ (:data:`vlmatch.training.config.RESUMABLE_CHANGES`).

One writer per run folder: a run (fresh, ``--overwrite`` or ``--resume``) holds the folder's lock
(``.vlmatch.lock``, as an index build does) from before it reads or removes anything until it ends;
a second run of the same folder is refused at once, naming the process that holds it.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

from ..errors import ConfigError
from ..io import writer_lock
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
    """``--resume`` of a run killed before its first ``last/`` checkpoint: nothing was learned that a resume
    could keep, so the run starts over from step 1 (returns False: not a resume). That includes a kill between
    the first ``best/`` (the first validation, in epoch 1) and the first ``last/``: that ``best/`` is made again
    by the run started over. A folder whose ``best/`` is from a later epoch has lost its ``last/`` some other
    way: refused, naming ``--overwrite`` (starting over would delete a best checkpoint it cannot give back)."""
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
