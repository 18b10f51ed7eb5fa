"""Registry of named model configurations: ``create_model(name, **overrides)``."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .base import MatchingModel, check_options, make_config, read_config_json

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
    return _entry(name)[0]


def _entry(name: str):
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def check_model_options(name: str, options: dict) -> dict:
    """Check options of model ``name`` against its Config's declared types/ranges (nothing is built)."""
    cls, defaults, _ = _entry(name)
    make_config(cls.Config, defaults, options, name)  # also runs a __post_init__ rule
    return check_options(cls.Config, options, name)


def create_model(name: str, **overrides) -> MatchingModel:
    """A fresh model of a registered configuration, with any option overridden by keyword."""
    cls, defaults, _ = _entry(name)
    config = make_config(cls.Config, defaults, overrides, name)
    try:
        model = cls(config)
    except ValueError as e:  # a model's own check of its options
        raise ConfigError(f"model {name!r}: {e}") from None
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
    from . import caan, scan, sman, vse  # noqa: F401
