"""Registry of named model configurations: ``create_model(name, **overrides)``.

The registry knows no model file: each model module registers its names when it is imported, and
``vlmatch.models`` imports them all (as timm's ``models/__init__`` does)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError, DataError
from ..io import complete_dir
from ..weights import describe_problems, read_header, sha256_file, shape_problems, verify_sha256
from .base import MatchingModel, check_options, make_config, read_config_json
from .calibration import attach_calibration
from .sealing import CHECKSUMS, verify_checkpoint

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
    return Path(spec)


def load_model(checkpoint_dir, map_location="cpu", *, note_unsealed: bool = True) -> MatchingModel:
    """Load a model saved with ``model.save(dir)``: config.json + model.safetensors (+ vocab.json).
    ``pretrained:NAME`` loads a trained model shipped with vlmatch (see ``vlmatch pretrained``).
    Every file is checked against the folder's checksums.json; a folder without one (an older save) loads
    with a note, unless ``note_unsealed`` is False (a copy inside an index, which its manifest seals).

    An option config.json lacks takes the model's ``legacy_options`` value (see :func:`checkpoint_options`)."""
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
        opts = check_model_options(cfg["name"], checkpoint_options(cfg["name"], cfg["config"]))
    except ConfigError as e:
        raise DataError(d / "config.json", str(e)) from None
    header = read_header(weights)  # a file that is no safetensors at all is named as such first
    digest = sha256_file(weights)
    verify_sha256(weights, cfg.get("weights_sha256"), d / "config.json", actual=digest)
    # compare the file's shapes with the model's before anything is allocated (a meta-device build)
    expected = _meta_shapes(cfg["name"], opts)
    if expected is not None:
        from ..encoders.lora import unused_pooler_keys

        legacy = set(unused_pooler_keys(header)) - set(expected)  # dropped by load_weights (an older save)
        problems = shape_problems({k: v for k, v in header.items() if k not in legacy}, expected)
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
    model.load_extra(d)  # (its text encoder's record: the encoder it names must be the one installed)
    # every file against checksums.json (the checks above name what does not make sense; this, what was
    # changed, removed or copied in since the save), before the calibration is attached
    if verify_checkpoint(d, known={"model.safetensors": digest}) is None and note_unsealed:
        _unsealed(d)
    attach_calibration(model, d)
    return model.to(map_location).eval()


_WARNED: set[Path] = set()


def _unsealed(d: Path) -> None:
    """Say once per folder that a checkpoint has no checksums.json (saved before vlmatch sealed them): its
    weights are still checked against config.json, its other files are not."""
    key = d.resolve()
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"vlmatch: note: {d} has no {CHECKSUMS} (saved by an older vlmatch): only its weights are checked, "
              f"not its other files; `vlmatch seal {d}` records them", file=sys.stderr)


def load_checkpoint(checkpoint, map_location="cpu") -> MatchingModel:
    """A checkpoint ready to score captions: :func:`load_model`, and its vocabulary when the model
    tokenises with one (a folder without ``vocab.json`` is refused here, not at the first caption)."""
    model = load_model(checkpoint, map_location=map_location)
    if model.uses_vocab and model.vocab is None:
        raise DataError(checkpoint, "no vocab.json beside the model")
    return model


def _meta_shapes(name: str, opts: dict) -> dict[str, tuple] | None:
    """Parameter shapes of a model built on the meta device (no memory); None if it cannot be."""
    import torch

    try:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in create_model(name, **opts).state_dict().items()}
    except Exception:  # a model whose construction needs real tensors: its load_weights still checks
        return None
