"""Run configuration: YAML files with three sections (model, data, train), ``--set`` overrides.

Bundled configs live in ``vlmatch/configs`` (also reachable as ``configs/`` at the repo root);
``--config NAME`` finds them by name, ``--config path.yaml`` reads any file.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from .errors import ConfigError, DataError

BUNDLED = Path(__file__).parent / "configs"

DEFAULTS: dict = {
    "model": {"name": "vsepp"},  # plus any model option (embed_dim, lambda_softmax, ...)
    "data": {
        "path": None,  # a precomp folder; "toyworld" = the bundled synthetic data (generated on demand)
        "train_split": "train",
        "val_split": "dev",
        "val_max_images": 1000,  # SCAN's model selection on the first 1000 dev images / 5000 captions
        "vocab": None,  # a SCAN vocab JSON; built from the training captions when absent
        "min_word_count": 4,
    },
    "train": {
        "epochs": 30,
        "batch_size": 128,  # per process under torchrun
        "lr": 2e-4,
        "lr_update": 15,  # lr x 0.1 every lr_update epochs
        "grad_clip": 2.0,
        "margin": 0.2,
        "max_violation": True,
        "warmup_epochs": 0,  # epochs with the loss summed over all negatives before hardest negatives
        "val_every_steps": 0,  # also validate every N steps (0: only at epoch ends)
        "checkpoint_every_steps": 0,  # also save last/ every N steps (0: only at epoch ends)
        "log_every": 10,
        "seed": 0,
        "device": "auto",
        "threads": 0,  # torch threads (0: torch's default)
        "workers": 0,  # DataLoader workers
        "max_steps_per_epoch": None,  # cap (smoke tests)
        "stop_after_steps": None,  # exit abruptly after this global step (tests the resume path)
    },
}


def resolve_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (BUNDLED / name_or_path, BUNDLED / f"{name_or_path}.yaml"):
        if cand.is_file():
            return cand
    raise DataError(p, f"config not found (neither a file nor a bundled config; bundled: "
                       f"{', '.join(sorted(x.stem for x in BUNDLED.glob('*.yaml')))})")


def load_config(name_or_path: str | None = None, overrides: list[str] = (), extra: dict | None = None) -> dict:
    cfg = copy.deepcopy(DEFAULTS)
    if name_or_path:
        path = resolve_path(name_or_path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise DataError(path, f"not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise DataError(path, "a config must be a mapping with sections model, data, train")
        unknown = set(data) - set(DEFAULTS)
        if unknown:
            raise DataError(path, f"unknown section(s) {sorted(unknown)}; expected {sorted(DEFAULTS)}")
        cfg = _merge_sections(cfg, data)
    if extra:
        cfg = _merge_sections(cfg, extra)
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def _merge_sections(cfg: dict, data: dict) -> dict:
    for section, values in data.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r} must be a mapping")
        unknown = set(values) - set(cfg[section])
        if section != "model" and unknown:
            raise ConfigError(f"unknown config key(s) {sorted(unknown)} in section {section!r}; "
                              f"known: {sorted(cfg[section])}")
        cfg[section].update(copy.deepcopy(values))
    return cfg


def apply_override(cfg: dict, item: str) -> None:
    """``section.key=value`` with the value parsed as YAML (numbers, booleans, null, lists)."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    key, value = item.split("=", 1)
    section, name = key.split(".", 1)
    if section not in cfg:
        raise ConfigError(f"--set {item!r}: unknown section {section!r}; known: {sorted(cfg)}")
    if section != "model" and name not in cfg[section]:
        raise ConfigError(f"--set {item!r}: unknown key {key}; known: {sorted(cfg[section])}")
    cfg[section][name] = yaml.safe_load(value)


def dump(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
