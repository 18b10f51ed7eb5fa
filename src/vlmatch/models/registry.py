"""Registry of named model configurations: ``create_model(name, **overrides)``."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .base import MatchingModel, make_config, read_config_json

_REGISTRY: dict[str, tuple[type[MatchingModel], dict, str]] = {}


def register(name: str, cls: type[MatchingModel], description: str = "", **defaults) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = (cls, defaults, description)


def list_models() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def describe_models() -> dict[str, str]:
    _load_builtin()
    return {n: _REGISTRY[n][2] for n in sorted(_REGISTRY)}


def model_class(name: str) -> type[MatchingModel]:
    """The class behind a registered name (e.g. to ask ``uses_vocab`` before building the model)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name][0]


def create_model(name: str, **overrides) -> MatchingModel:
    """A fresh model of a registered configuration, with any option overridden by keyword."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    cls, defaults, _ = _REGISTRY[name]
    model = cls(make_config(cls.Config, defaults, overrides, name))
    model.name = name
    return model


def load_model(checkpoint_dir, map_location="cpu") -> MatchingModel:
    """Load a model saved with ``model.save(dir)``: config.json + model.safetensors (+ vocab.json)."""
    from ..data.vocab import Vocab

    d = Path(checkpoint_dir)
    cfg = read_config_json(d / "config.json")
    model = create_model(cfg["name"], **cfg["config"])
    model.load_weights(d / "model.safetensors")
    if (d / "vocab.json").is_file():
        model.vocab = Vocab.load(d / "vocab.json")
    model.load_extra(d)
    return model.to(map_location).eval()


def _load_builtin() -> None:
    # Importing the model modules registers their names.
    from . import caan, scan, vse  # noqa: F401
