"""Run configuration: YAML files with sections model, data and train (plus a ``recipe:`` section training ignores),
``--set`` overrides. Every option is a dataclass field with :func:`vlmatch.options.option` metadata (a model's
``Config``; :class:`DataOptions` and :class:`TrainOptions` here); a loaded config stays a plain dict. ``--config NAME``
finds a bundled config (``vlmatch/configs``), ``--config path.yaml`` reads any file.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..data.resolve import UNSET_VARIABLE, expand_path
from ..errors import ConfigError, DataError
from ..options import check_mapping, dataclass_specs, defaults, option, raise_problems, resumable

BUNDLED = Path(__file__).parent.parent / "configs"  # package data: vlmatch/configs
RECIPE = "recipe"  # the section a recipe file adds to a config (experiments/README.md): read by its runner, not here

@dataclass
class DataOptions:
    """The ``data`` section of a run's config."""

    path: str | None = option(None, doc="a precomp folder; 'toyworld' = the bundled synthetic data")
    train_split: str = option("train")
    val_split: str = option("dev")
    val_max_images: int | None = option(1000, min=1, doc="SCAN's model selection on the first 1000 dev images")
    vocab: str | None = option(None, doc="a SCAN vocab JSON; built from the training captions when absent")
    min_word_count: int = option(4, min=1)
    entities: str | None = option(None, doc="a Flickr30k Entities folder of the train images (train.grounding_loss)")
    check_finite: bool = option(True, resumable=True, doc="scan every split for NaN/inf once at start")
    mirror: float = option(0.0, min=0.0, max=1.0, doc="the chance a train pair shows its image's mirror view "
                                                      "({train_split}_mirror_ims.npy), drawn each epoch (0: off)")
    exclude_words: list[str] | None = option(None, doc="leave out every train image whose captions name one of these "
                                                       "words (vlmatch.data.heldout)")


@dataclass
class TrainOptions:
    """The ``train`` section of a run's config. ``resumable``: a run may go on with another value."""

    epochs: int = option(30, min=1, resumable=True)
    batch_size: int = option(128, min=1, doc="per process under torchrun")
    lr: float = option(2e-4, min=0, gt=True)
    lr_update: int = option(15, min=1, doc="lr x lr_decay every lr_update epochs")
    lr_schedule: list[list[float]] | None = option(
        None, min=0, doc="[[epoch, lr], ...] from epoch 0, piecewise constant; replaces lr / lr_update")
    pretrained_lr_scale: float = option(1.0, min=0, gt=True, doc="lr of a fine-tuned pretrained transformer as a "
                                                                 "multiple of the rest's")
    optimizer: str = option("adam", choices=("adam", "adadelta"), doc="adam | adadelta (rho 0.9)")
    weight_decay: float = option(0.0, min=0, doc="L2 penalty of the optimizer")
    lr_decay: float = option(0.1, min=0, max=1, gt=True, doc="step-decay factor (MTFN halves: 0.5)")
    stage: str | None = option(None, doc="training stage of a multi-stage model (MTFN: image_text, then text_text)")
    init_from: str | None = option(None, doc="a checkpoint folder whose weights (and vocab) start this run")
    # the grounding objective (docs/grounding.md): its weight beside the matching loss (needs data.entities; 0: off),
    # softmax temperature, form ('mass' inside the boxes, or 'peak' inside above outside) and map
    grounding_loss: float = option(0.0, min=0)
    grounding_temperature: float = option(0.2, min=0, gt=True)
    grounding_form: str = option("mass", choices=("mass", "peak"))
    grounding_map: str = option("contribution", choices=("contribution", "attention", "gradient"))
    grad_clip: float = option(2.0, min=0)
    margin: float = option(0.2, min=0)
    max_violation: bool = option(True)
    warmup_epochs: int = option(0, min=0, doc="epochs summing over all negatives before hardest negatives")
    patience: int = option(0, min=0, resumable=True, doc="stop once val rsum has not improved for this many epochs")
    min_epochs: int = option(0, min=0, resumable=True, doc="... but never before this many epochs")
    val_every_steps: int = option(0, min=0, doc="also validate every N steps (0: only at epoch ends)")
    val_top_k: int = option(0, min=0, doc="validate two-stage: re-score each query's top K (0: exhaustive)")
    checkpoint_every_steps: int = option(0, min=0, doc="also save last/ every N steps (0: only at epoch ends)")
    log_every: int = option(10, min=1)
    seed: int = option(0, min=0, max=2**63 - 1)
    device: str = option("auto", resumable=True)
    threads: int = option(0, min=0, resumable=True, doc="torch threads (0: torch's default)")
    reuse_freed_memory: bool = option(True, resumable=True, doc="keep freed memory for the next step "
                                                                 "(vlmatch.training.allocator)")
    compile: bool = option(False, resumable=True, doc="the model's score through torch.compile (steps and validation)")
    workers: int = option(0, min=0, resumable=True, doc="DataLoader workers")
    max_steps_per_epoch: int | None = option(None, min=1, doc="cap (smoke tests)")
    stop_after_steps: int | None = option(None, min=1, resumable=True, doc="exit after this global step (tests)")


# The sections of a config file: ``model`` (its name, plus any option of that model's Config), ``data``, ``train``.
SECTIONS: dict[str, type] = {"data": DataOptions, "train": TrainOptions}
DEFAULTS: dict = {"model": {"name": "vsepp"}, **{name: defaults(cls) for name, cls in SECTIONS.items()}}
# Options that may differ between a run and its resumption (they do not change what is computed).
RESUMABLE_CHANGES = {(name, key) for name, cls in SECTIONS.items() for key in resumable(cls)}


class _Loader(yaml.SafeLoader):
    """PyYAML (YAML 1.1) reads ``1e-4`` as a string; read numbers as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_yaml(text: str):
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no !!python tags


def yaml_problem(e: Exception) -> str:
    """A YAML (or decoding) error in one line: where and what (PyYAML's own text spans several lines)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(what).split())


def read_yaml_file(path: Path):
    """The YAML document of ``path``; one line naming the file and the place when it is not YAML."""
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DataError(path, f"not valid YAML: {yaml_problem(e)}") from None
    except OSError as e:
        raise DataError(path, f"cannot be read ({e.strerror})") from None


def resolve_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (BUNDLED / name_or_path, BUNDLED / f"{name_or_path}.yaml"):
        if cand.is_file():
            return cand
    raise DataError(p, f"config not found (neither a file nor a bundled config; bundled: "
                       f"{', '.join(sorted(x.stem for x in BUNDLED.glob('*.yaml')))})")


def describe_configs() -> dict[str, str]:
    """Bundled config names -> their first comment line (what the config is for)."""
    out = {}
    for p in sorted(BUNDLED.glob("*.yaml")):
        first = next((ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()), "")
        out[p.stem] = first.lstrip("#").strip() if first.lstrip().startswith("#") else ""
    return out


def load_config(name_or_path: str | None = None, overrides: list[str] = (), extra: dict | None = None) -> dict:
    cfg = copy.deepcopy(DEFAULTS)
    if name_or_path:
        path = resolve_path(name_or_path)
        data = read_yaml_file(path) or {}
        if not isinstance(data, dict):
            raise DataError(path, "a config must be a mapping with sections model, data, train")
        data.pop(RECIPE, None)
        unknown = set(data) - set(DEFAULTS)
        if unknown:
            raise DataError(path, f"unknown section(s) {sorted(unknown)}; expected {sorted(DEFAULTS)}")
        cfg = _merge_sections(cfg, data)
    if extra:
        cfg = _merge_sections(cfg, extra)
    for item in overrides:
        apply_override(cfg, item)
    return check_config(cfg, source=str(path) if name_or_path else None)


PATHS = (("data", "path"), ("data", "vocab"), ("data", "entities"), ("train", "init_from"))  # folders and files


def check_config(cfg: dict, source: str | None = None) -> dict:
    """Check every section against its declared types and ranges and the model options against the model's
    ``Config``; returns a normalised copy. All problems are raised together, one line each."""
    from ..models.registry import check_model_options

    out, problems = {}, []
    for section in DEFAULTS:
        if section != "model":
            out[section], found = check_mapping(cfg.get(section) or {}, dataclass_specs(SECTIONS[section]), section)
            problems += found
    for section, key in PATHS:  # written portably ($VLMATCH_CACHE/...): this machine's folders from here on
        if isinstance(out[section].get(key), str) and out[section][key] != "toyworld":
            out[section][key] = expand_path(out[section][key])
            unset = UNSET_VARIABLE.search(out[section][key])
            if unset:
                problems.append(f"{section}.{key} {out[section][key]!r}: ${unset.group(1)} is not set (set it to the "
                                "folder it names, or write the path)")
    if "lr_schedule" in out["train"]:
        out["train"]["lr_schedule"], problem = check_schedule(out["train"]["lr_schedule"])
        if problem:
            problems.append(f"train.lr_schedule {problem}")
    if (out["train"].get("grounding_loss") or 0) > 0 and not out["data"].get("entities"):
        problems.append("train.grounding_loss needs data.entities: the Flickr30k Entities folder of the train images")
    if isinstance(out["train"].get("device"), str):
        problem = device_problem(out["train"]["device"])
        if problem:
            problems.append(f"train.device {problem}")
    model = dict(cfg.get("model") or {})
    name = model.pop("name", None)
    if not isinstance(name, str):
        problems.append(f"model.name must be a registered model name (see `vlmatch models`), got {name!r}")
        out["model"] = {"name": name, **model}
    else:
        try:
            out["model"] = {"name": name, **check_model_options(name, model)}
        except ConfigError as e:
            problems += [ln.strip() for ln in str(e).splitlines() if ln.startswith("  ")] or [str(e)]
    for section in cfg:
        if section not in out:
            out[section] = copy.deepcopy(cfg[section])
    raise_problems(problems, source)
    return out


def check_schedule(schedule) -> tuple[list | None, str | None]:
    """[[epoch, lr], ...]: pairs, epochs whole and increasing from 0, learning rates > 0; epochs -> int."""
    if not isinstance(schedule, list) or not all(isinstance(p, list | tuple) for p in schedule):
        return schedule, None  # null, or already reported by its Spec
    if not schedule or any(len(p) != 2 for p in schedule):
        return schedule, f"must be a list of [epoch, lr] pairs, got {schedule!r}"
    epochs = [p[0] for p in schedule]
    if epochs[0] != 0 or any(e != int(e) for e in epochs) or any(b <= a for a, b in itertools.pairwise(epochs)):
        return schedule, f"epochs must be whole numbers increasing from 0, got {epochs}"
    if any(p[1] <= 0 for p in schedule):
        return schedule, f"learning rates must be > 0, got {[p[1] for p in schedule]}"
    return [[int(e), float(lr)] for e, lr in schedule], None


def device_problem(name: str) -> str | None:
    import torch

    if name == "auto":
        return None
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        return f"must be auto, cpu, cuda or cuda:N (or another torch device), got {name!r}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return f"is {name!r} but no CUDA device is available here (use auto or cpu)"
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"is {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return f"is {name!r} but MPS is not available here"
    if dev.type not in ("cpu", "cuda", "mps"):
        return f"{name!r} is not supported (auto, cpu, cuda, cuda:N, mps)"
    return None


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
    try:
        cfg[section][name] = parse_yaml(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML ({e})") from None


def dump(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
