"""Which image backbone a checkpoint was trained on (its ``backbone.json``, else the ``features.json`` of the
training data its run's ``config.yaml`` names), and the check that features fit it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, DataError
from ..io import read_json


def checkpoint_backbone(checkpoint) -> dict | None:
    """The backbone description a checkpoint was trained on, or None when it cannot be told."""
    ck = Path(checkpoint)
    if (ck / "backbone.json").is_file():
        return read_json(ck / "backbone.json")
    cfg_path = ck.parent / "config.yaml"
    if not cfg_path.is_file():
        return None
    import yaml

    try:
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return None
    data = (cfg.get("data") or {}).get("path")
    if not data or data == "toyworld":
        return None
    for root in (Path(data), ck.parent / data):
        if (root / "features.json").is_file():
            return read_json(root / "features.json").get("backbone")
    return None


def same_backbone(a: dict, b: dict) -> bool:
    keys = ("name", "input_size", "grid", "dim", "normalisation")
    return all(a.get(k) == b.get(k) for k in keys)


def check_backbone(trained: dict | None, used: dict, img_dim: int, where) -> None:
    """Raise a one-line error when features from ``used`` cannot feed a model trained on ``trained``."""
    if trained is not None and not same_backbone(trained, used):
        raise DataError(where, f"features come from backbone {used.get('name')} ({used.get('grid')}x{used.get('grid')}"
                               f"x{used.get('dim')}) but the model was trained on {trained.get('name')} "
                               f"({trained.get('grid')}x{trained.get('grid')}x{trained.get('dim')})")
    if used.get("dim") is not None and used["dim"] != img_dim:
        raise DataError(where, f"backbone {used.get('name')} gives {used['dim']}-d features but the model expects "
                               f"img_dim={img_dim}")


def resolve_backbone(checkpoint, override: str | None) -> dict:
    """The backbone to extract features with for ``checkpoint`` (``override`` must agree with it), as a
    description for ``features.backbones.backbone_for``: its name, and the input size it was trained at
    where that is known."""
    trained = checkpoint_backbone(checkpoint)
    if override is None:
        if trained is None:
            raise ConfigError(f"{checkpoint}: cannot tell which image backbone this model was trained on (no "
                              "backbone.json, no features.json behind its run's config.yaml); pass --backbone NAME")
        return {"name": trained["name"], "input_size": trained.get("input_size")}
    if trained is not None and trained["name"] != override:
        raise DataError(checkpoint, f"--backbone {override} but the model was trained on {trained['name']} features")
    return {"name": override, "input_size": None if trained is None else trained.get("input_size")}
