"""Registry of named model configurations: ``create_model(name, **overrides)``."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError, DataError
from ..io import complete_dir
from ..weights import describe_problems, read_header, shape_problems, verify_sha256
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


# "prefix:" -> a function giving the checkpoint folder a name stands for (vlmatch.pretrained registers
# "pretrained:"); kept as a hook so this layer never imports the layers above it
_RESOLVERS: dict[str, object] = {}


def register_resolver(prefix: str, resolve) -> None:
    """``resolve(name) -> Path``: a checkpoint folder for ``prefix + name`` (e.g. ``pretrained:NAME``)."""
    _RESOLVERS[prefix] = resolve


def resolve_checkpoint(spec) -> Path:
    """The folder a checkpoint argument names: a path, or ``pretrained:NAME`` (a model shipped with vlmatch)."""
    text = str(spec)
    for prefix, resolve in _RESOLVERS.items():
        if text.startswith(prefix):
            return resolve(text[len(prefix):])
    if text.startswith("pretrained:"):  # the registry was not imported (vlmatch/__init__ imports it)
        from importlib import import_module

        import_module("vlmatch.pretrained")
        return resolve_checkpoint(spec)
    return Path(spec)


def load_model(checkpoint_dir, map_location="cpu") -> MatchingModel:
    """Load a model saved with ``model.save(dir)``: config.json + model.safetensors (+ vocab.json).
    ``pretrained:NAME`` loads a trained model shipped with vlmatch (see ``vlmatch pretrained``)."""
    from ..data.vocab import Vocab

    d = resolve_checkpoint(checkpoint_dir)
    if not d.is_dir() and complete_dir(d) is not None:  # a save was interrupted between its renames
        print(f"vlmatch: {d} is missing (an interrupted save); loading {complete_dir(d)}", file=sys.stderr)
        d = complete_dir(d)
    if not (d / "config.json").is_file():
        inside = {"best": "best on validation", "last": "latest saved"}
        found = [f"{d / sub} ({what})" for sub, what in inside.items() if (d / sub / "config.json").is_file()]
        if found:
            raise DataError(d, f"a run folder, not a checkpoint: use {' or '.join(found)}")
    cfg = read_config_json(d / "config.json")
    weights = d / "model.safetensors"
    if not isinstance(cfg["config"], dict):
        raise DataError(d / "config.json", "'config' must be an object of model options")
    try:
        opts = check_model_options(cfg["name"], cfg["config"])
    except ConfigError as e:
        raise DataError(d / "config.json", str(e)) from None
    header = read_header(weights)  # a file that is no safetensors at all is named as such first
    verify_sha256(weights, cfg.get("weights_sha256"), d / "config.json")
    # compare the file's shapes with the model's before anything is allocated (a meta-device build)
    expected = _meta_shapes(cfg["name"], opts)
    if expected is not None:
        problems = shape_problems(header, expected)
        if problems:
            raise DataError(weights, f"weights do not fit {d / 'config.json'} (model {cfg['name']}): "
                                     f"{describe_problems(problems)}")
    model = create_model(cfg["name"], **opts)
    model.load_weights(weights)  # the content was verified above
    if (d / "vocab.json").is_file():
        model.vocab = Vocab.load(d / "vocab.json")
        size = getattr(model.cfg, "vocab_size", None)
        if model.uses_vocab and size is not None and len(model.vocab) > size:
            raise DataError(d / "vocab.json", f"{len(model.vocab)} words, but the model's vocab_size in config.json "
                                              f"is {size}: this vocabulary does not belong to these weights")
    model.load_extra(d)
    return model.to(map_location).eval()


def _meta_shapes(name: str, opts: dict) -> dict[str, tuple] | None:
    """Parameter shapes of a model built on the meta device (no memory); None if it cannot be."""
    import torch

    try:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in create_model(name, **opts).state_dict().items()}
    except Exception:  # a model whose construction needs real tensors: its load_weights still checks
        return None


def _load_builtin() -> None:
    # Importing the model modules registers their names.
    from . import caan, mmca, mtfn, scan, sman, vse  # noqa: F401
