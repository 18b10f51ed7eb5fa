"""Registry of named model configurations: ``create_model(name, **overrides)``.

The registry knows no model file: each model module registers its names when it is imported, and
``vlmatch.models`` imports them all (as timm's ``models/__init__`` does)."""

from __future__ import annotations

from pathlib import Path

from ..checkpoints.read import (
    build_model,
    finish_model,
    read_checkpoint,
    read_config_json,
    register_resolver,
    resolve_checkpoint,
)
from ..checkpoints.seal import sealed_format
from ..errors import ConfigError, DataError
from .base import MatchingModel, check_options, make_config
from .calibration import attach_calibration

__all__ = ["register", "list_models", "describe_models", "model_class", "check_model_options", "model_config",
           "checkpoint_options", "saved_options", "legacy_conflicts", "create_model", "load_model", "load_checkpoint",
           "register_resolver", "resolve_checkpoint"]

_REGISTRY: dict[str, tuple[type[MatchingModel], dict, str]] = {}


def register(name: str, cls: type[MatchingModel], description: str = "", **defaults) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = (cls, defaults, description)


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def describe_models() -> dict[str, str]:
    return {n: _REGISTRY[n][2] for n in sorted(_REGISTRY)}


def model_class(name: str) -> type[MatchingModel]:
    """The class behind a registered name (e.g. to ask ``uses_vocab`` before building the model)."""
    return _entry(name)[0]


def _entry(name: str):
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def check_model_options(name: str, options: dict) -> dict:
    """Check options of model ``name`` against its Config's declared types/ranges (nothing is built)."""
    model_config(name, options)  # also runs a __post_init__ rule
    return check_options(_entry(name)[0].Config, options, name)


def model_config(name: str, options: dict):
    """The Config a model ``name`` built with ``options`` would have: registered defaults, then ``options``."""
    cls, defaults, _ = _entry(name)
    return make_config(cls.Config, defaults, options, name)


def checkpoint_options(name: str, saved: dict) -> dict:
    """The options of a saved model: its config.json's ``config``, each key it lacks taken from the model's
    ``legacy_options`` (the value it was made with), not from today's default."""
    return {**_entry(name)[0].legacy_options, **saved}


def saved_options(checkpoint_dir) -> dict:
    """The options the checkpoint in ``checkpoint_dir`` was made with (:func:`checkpoint_options` of its
    config.json); {} when that names no registered model (loading the weights then says what is wrong)."""
    saved = read_config_json(Path(checkpoint_dir) / "config.json")
    if not isinstance(saved["config"], dict) or saved["name"] not in list_models():
        return {}
    return checkpoint_options(saved["name"], saved["config"])


def legacy_conflicts(model: MatchingModel, checkpoint_dir) -> list[str]:
    """The options whose default changed (``model.legacy_options``) that differ between ``model`` and the
    checkpoint in ``checkpoint_dir`` as it was made: continuing from its weights (``train.init_from``)
    would silently change its equations. One "model.KEY: ..." line each."""
    made = saved_options(checkpoint_dir)
    return [f"model.{k}: {made[k]!r} in {Path(checkpoint_dir) / 'config.json'}, {getattr(model.cfg, k)!r} now"
            for k in type(model).legacy_options if k in made and made[k] != getattr(model.cfg, k)]


def create_model(name: str, vocab=None, **overrides) -> MatchingModel:
    """A fresh model of a registered configuration, with any option overridden by keyword.

    ``vocab`` (a :class:`vlmatch.data.vocab.Vocab` built from the training captions) is attached to
    the model (``model.tokenize`` uses it, ``save`` writes it) and sets ``vocab_size``.
    """
    cls, defaults, _ = _entry(name)
    if vocab is not None:
        overrides.setdefault("vocab_size", len(vocab))
        if overrides["vocab_size"] < len(vocab):
            raise ConfigError(f"vocab_size={overrides['vocab_size']} is smaller than the vocabulary ({len(vocab)} words)")
    config = make_config(cls.Config, defaults, overrides, name)
    try:
        model = cls(config)
    except ValueError as e:  # a model's own check of its options
        raise ConfigError(f"model {name!r}: {e}") from None
    model.name = name
    if vocab is not None:
        model.vocab = vocab
    return model


def load_model(checkpoint_dir, map_location="cpu", *, note_unsealed: bool = True) -> MatchingModel:
    """Load a model saved with ``model.save(dir)``: config.json + model.safetensors (+ vocab.json).
    ``pretrained:NAME`` loads a trained model shipped with vlmatch (see ``vlmatch pretrained``).
    Every file is checked against the folder's checksums.json; a folder without one (an older save) loads
    with a note, unless ``note_unsealed`` is False (a copy inside an index, which its manifest seals); a
    folder saved sealed (config.json's ``format`` 2) without it, or whose format was removed, is refused.

    An option config.json lacks takes the model's ``legacy_options`` value (see :func:`checkpoint_options`)."""
    ck = read_checkpoint(checkpoint_dir)  # the folder and its config.json (vlmatch.checkpoints.read)
    try:
        ck.options = check_model_options(ck.name, checkpoint_options(ck.name, ck.config["config"]))
    except ConfigError as e:
        raise DataError(ck.config_path, str(e)) from None
    ck.read_weights()  # header and SHA-256, each read once
    model = build_model(ck, create_model)  # built once (on the meta device), shapes checked, then filled
    finish_model(ck, model, note_unsealed)  # vocabulary, the model's own files, the seal
    # the calibration must name these weights (a save since calibrations record them), whatever the seal says
    attach_calibration(model, ck.folder, ck.weights_sha256, bound=sealed_format(ck.config))
    return model.to(map_location).eval()


def load_checkpoint(checkpoint, map_location="cpu") -> MatchingModel:
    """A checkpoint ready to score captions: :func:`load_model`, and its vocabulary when the model
    tokenises with one (a folder without ``vocab.json`` is refused here, not at the first caption)."""
    model = load_model(checkpoint, map_location=map_location)
    if model.uses_vocab and model.vocab is None:
        raise DataError(checkpoint, "no vocab.json beside the model")
    return model


from . import load_builtin_models  # noqa: E402 (each model module registers its names with this one)

load_builtin_models()
