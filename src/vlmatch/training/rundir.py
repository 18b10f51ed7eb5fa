"""Run folders: one run per folder, never mixed.

A fresh run refuses a folder that already holds a run (``config.yaml``, ``metrics.jsonl``, ``last/``,
``best/`` ...) unless told to ``overwrite`` it, which removes only those entries (never other files
the user keeps there). A resumed run must be the run the checkpoint was made by: the configuration
saved in ``last/trainer_state.json`` is compared with the one resumed with, and only options that do
not change what is computed may differ (:data:`vlmatch.training.config.RESUMABLE_CHANGES`).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from ..errors import ConfigError
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
