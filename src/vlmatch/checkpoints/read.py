"""Reading a checkpoint folder: each file read once and checked, in one line naming it, before and as a model is
built from it (JSON and safetensors only, never pickle). ``registry.load_model`` runs :func:`read_checkpoint`,
:meth:`Checkpoint.read_weights`, :func:`build_model` and :func:`finish_model` in that order; ``init_from`` and a
resume read through :func:`load_weights_into` and :func:`load_training_state`. Never imports :mod:`vlmatch.models`
(what is model-specific comes as ``create`` or a model method) nor torch at import time (the CLI resolves
``--model`` with it)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from ..io import complete_dir, read_json
from .seal import CHECKSUMS, unsealed_problem, verify_checkpoint

EDITED = "(the file was edited: restore it, or start the run over with --overwrite)"

# "prefix:" -> the function giving the folder a name stands for (a hook: this layer imports nothing above it)
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


def checkpoint_folder(spec) -> Path:
    """The folder ``spec`` names: an interrupted save's ``NAME.prev`` taken, a run folder refused."""
    d = resolve_checkpoint(spec)
    if not d.is_dir() and complete_dir(d) is not None:  # a save was interrupted between its renames
        print(f"vlmatch: {d} is missing (an interrupted save); loading {complete_dir(d)}", file=sys.stderr)
        d = complete_dir(d)
    if not (d / "config.json").is_file():
        inside = {"best": "best on validation", "last": "latest saved"}
        found = [f"{d / sub} ({what})" for sub, what in inside.items() if (d / sub / "config.json").is_file()]
        if found:
            raise DataError(d, f"a run folder, not a checkpoint: use {' or '.join(found)}")
    return d


@dataclass
class Checkpoint:
    """A checkpoint folder's config.json, then (:meth:`read_weights`) the weights' header and verified SHA-256."""

    folder: Path
    config: dict
    options: dict = field(default_factory=dict)  # config.json's options, checked by the registry
    header: dict | None = None
    weights_sha256: str | None = None

    @property
    def name(self) -> str:
        return self.config["name"]

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    @property
    def weights(self) -> Path:
        return self.folder / "model.safetensors"

    def read_weights(self) -> Checkpoint:
        """The safetensors header and the weights' SHA-256, checked against config.json."""
        self.header, self.weights_sha256 = read_weights_header(self.weights, self.config.get("weights_sha256"),
                                                               self.config_path)
        return self


def read_config_json(path) -> dict:
    """A checkpoint's config.json: an object with 'name' and an object 'config' (the model's options)."""
    path = Path(path)
    obj = read_json(path, "config.json not found (is this a vlmatch checkpoint folder?)")
    if not isinstance(obj, dict) or "name" not in obj or "config" not in obj:
        raise DataError(path, "expected an object with 'name' and 'config'")
    if not isinstance(obj["config"], dict):
        raise DataError(path, "'config' must be an object of model options")
    return obj


def read_checkpoint(spec) -> Checkpoint:
    d = checkpoint_folder(spec)
    return Checkpoint(d, read_config_json(d / "config.json"))


def read_weights_header(path, expected_sha256: str | None, recorded_in) -> tuple[dict, str]:
    """(name -> shape, SHA-256) of a safetensors file, the digest checked against ``expected_sha256`` when given."""
    from ..weights import read_header, sha256_file, verify_sha256

    header = read_header(path)
    digest = sha256_file(path)
    verify_sha256(path, expected_sha256, recorded_in, actual=digest)
    return header, digest


def fit_problems(header: dict, expected: dict) -> list[str]:
    """What differs between a file's shapes and a model's, less an older save's pooler adapters."""
    from ..encoders.lora import unused_pooler_keys
    from ..weights import shape_problems

    legacy = set(unused_pooler_keys(header)) - set(expected)
    return shape_problems({k: v for k, v in header.items() if k not in legacy}, expected)


def load_state(model, path, header: dict) -> None:
    """Fill ``model`` with the tensors of ``path`` (shapes already checked; an older save's pooler adapters
    dropped, refused if not zero); meta-device parameters are replaced, not copied into."""
    from ..encoders.lora import drop_unused_pooler, unused_pooler_keys

    state = _read_tensors(path)
    mine = model.state_dict()
    if [k for k in unused_pooler_keys(header) if k not in mine]:
        try:
            state = drop_unused_pooler(state, path)
        except ValueError as e:
            raise DataError(path, str(e).split(": ", 1)[1]) from None
    meta = any(t.is_meta for t in mine.values())
    if meta:  # assigned, not copied: each tensor in the dtype the model declares (a file may store float16)
        state = {k: v.to(mine[k].dtype) if k in mine and v.dtype != mine[k].dtype else v for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=meta)


def _read_tensors(path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(path, f"not a readable safetensors file: {e}") from None


def load_weights_into(model, path, sha256: str | None = None, recorded_in=None) -> None:
    """``model.load_weights``: the header and digest read once, the shapes compared, then the tensors."""
    from ..weights import describe_problems

    path = Path(path)
    header, _ = read_weights_header(path, sha256, recorded_in or path.parent / "config.json")
    problems = fit_problems(header, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    if problems:
        raise DataError(path, f"weights do not fit model {model.name}: {describe_problems(problems)}")
    load_state(model, path, header)


def build_model(ck: Checkpoint, create):
    """``create(name, **options)`` run once on the meta device (sizes that do not fit the weights allocate
    nothing), its shapes compared with the header, then its tensors replaced by the file's. A model that needs
    real tensors to build, or keeps one outside its state dict, is built for real and checked as it loads."""
    from ..weights import describe_problems, meta_build

    try:
        with meta_build():
            model = create(ck.name, **ck.options)
    except DataError:
        raise
    except Exception:  # a model whose construction needs real tensors
        model = None
    if model is not None:
        problems = fit_problems(ck.header, {k: tuple(v.shape) for k, v in model.state_dict().items()})
        if problems:
            raise DataError(ck.weights, f"weights do not fit {ck.config_path} (model {ck.name}): "
                                        f"{describe_problems(problems)}")
        load_state(model, ck.weights, ck.header)  # every meta tensor replaced by the file's (strict: all of them)
        if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            return model  # else a tensor the file does not hold (a buffer kept out of the state dict)
    model = create(ck.name, **ck.options)
    load_weights_into(model, ck.weights, ck.weights_sha256)
    return model


# vocabularies read in this process, by the SHA-256 of their file
_VOCABS: dict[str, object] = {}


def read_vocab(path):
    """The :class:`vlmatch.data.vocab.Vocab` of ``path``, read once per content in this process."""
    from ..data.vocab import Vocab
    from ..weights import sha256_file

    key = sha256_file(path)
    if key not in _VOCABS:
        _VOCABS[key] = Vocab.load(path)
    return _VOCABS[key]


def finish_model(ck: Checkpoint, model, note_unsealed: bool = True):
    """Vocabulary, the model's own files, then every file against checksums.json (a folder without one that
    is not an older save is refused: :func:`.seal.unsealed_problem`). The caller attaches the calibration next."""
    d = ck.folder
    if (d / "vocab.json").is_file():
        model.vocab = read_vocab(d / "vocab.json")
        size = getattr(model.cfg, "vocab_size", None)
        if model.uses_vocab and size is not None and len(model.vocab) > size:
            raise DataError(d / "vocab.json", f"{len(model.vocab)} words, but the model's vocab_size in config.json "
                                              f"is {size}: this vocabulary does not belong to these weights")
    model.load_extra(d)  # (its text encoder's record: the encoder it names must be the one installed)
    if verify_checkpoint(d, known={"model.safetensors": ck.weights_sha256}) is None:
        problem = unsealed_problem(d, ck.config)
        if problem is not None:
            raise problem
        if note_unsealed:
            _unsealed(d)
    return model


def verify_sealed(folder) -> dict[str, str] | None:
    """Every file of ``folder`` against its checksums.json; a folder without one is refused unless saved before
    vlmatch sealed them (:func:`.seal.unsealed_problem`; then None)."""
    files = verify_checkpoint(folder)
    if files is None:
        problem = unsealed_problem(folder, read_config_json(Path(folder) / "config.json"))
        if problem is not None:
            raise problem
    return files


_WARNED: set[Path] = set()


def _unsealed(d: Path) -> None:
    """Say once per folder that an older checkpoint has no checksums.json (only its weights are checked)."""
    key = d.resolve()
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"vlmatch: note: {d} has no {CHECKSUMS} (saved by an older vlmatch): only its weights are checked, "
              f"not its other files; `vlmatch seal {d}` records them", file=sys.stderr)


# --- a training checkpoint: the trainer state beside the model (written by :func:`.write.save_training_state`) ---

def _unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for name, val in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = val
    for name, val in meta.get("scalars", {}).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = val
    return {"state": state, "param_groups": meta["param_groups"]}


def read_state(ckpt) -> dict:
    """``ckpt/trainer_state.json``, checked (:func:`check_state`)."""
    state_file = Path(ckpt) / "trainer_state.json"
    return check_state(state_file, read_json(state_file, "trainer state not found"))


def load_training_state(path, model, optimizer) -> dict:
    """Resume from ``path`` (``last/``, or the ``last.prev`` an interrupted swap left): the trainer state and the
    folder's seal checked, then the weights, optimiser state and RNG loaded. Returns the trainer state."""
    import torch

    from ..weights import verify_sha256

    d = complete_dir(path)
    if d is None:
        raise DataError(path, "no checkpoint to resume from")
    state_file = d / "trainer_state.json"
    state = read_state(d)
    _check_optimizer_meta(state_file, state["optimizer"], optimizer)
    verify_sealed(d)  # sealed with the model: a part edited, swapped or removed since is named, the seal too
    model.load_weights(d / "model.safetensors", read_config_json(d / "config.json").get("weights_sha256"))
    verify_sha256(d / "optimizer.safetensors", state.pop("optimizer_sha256", None), state_file)
    tensors = _read_tensors(d / "optimizer.safetensors")
    if "rng.torch" not in tensors:
        raise DataError(d / "optimizer.safetensors", "no 'rng.torch' tensor (not an optimiser state vlmatch train wrote)")
    rng = tensors.pop("rng.torch")
    meta = state.pop("optimizer")
    try:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta))
        torch.set_rng_state(rng)
    except (ValueError, TypeError, KeyError, RuntimeError, IndexError) as e:
        raise DataError(state_file, f"optimizer: the saved state does not fit this run's optimiser ({e}); restore the "
                                    "file, or start the run over with --overwrite") from None
    return state


def _check_optimizer_meta(path, meta: dict, optimizer) -> None:
    """``param_groups`` (one per group of this run's optimiser, as many whole-number ids each) and ``scalars``."""
    def bad(field, problem):
        return DataError(path, f"optimizer.{field} {problem} {EDITED}")

    groups, want = meta.get("param_groups"), optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(want):
        raise bad("param_groups", f"is {str(groups)[:40]!r}; it must be a list of {len(want)} parameter group(s)")
    for i, (g, w) in enumerate(zip(groups, want, strict=True)):
        params = g.get("params") if isinstance(g, dict) else None
        if (not isinstance(params, list) or len(params) != len(w["params"])
                or not all(isinstance(p, int) and not isinstance(p, bool) for p in params)):
            raise bad(f"param_groups[{i}].params", f"is {str(params)[:40]!r}; it must list the ids of this group's "
                                                   f"{len(w['params'])} parameters")
    ids = {p for g in groups for p in g["params"]}
    if len(ids) != sum(len(g["params"]) for g in groups):
        raise bad("param_groups", "lists a parameter id twice")
    scalars = meta.get("scalars", {})
    if not isinstance(scalars, dict):
        raise bad("scalars", f"is {str(scalars)[:40]!r}; it must be an object")
    for key in scalars:
        pid, _, name = key.partition(".")
        if not (pid.isdigit() and int(pid) in ids and name):
            raise bad("scalars", f"has the key {key[:40]!r}; each must be 'ID.name' with the id of a parameter")


# the trainer state's scalars: (types allowed, least value); None stands for "no best epoch yet"
_COUNTS = ("epoch", "step_in_epoch", "global_step")
_FIELDS = {**{k: ((int,), 0) for k in _COUNTS}, "best_rsum": ((int, float), None), "best_epoch": ((int, type(None)), 0),
           "elapsed": ((int, float), 0), "stale_epochs": ((int,), 0)}


def check_state(path, state) -> dict:
    """``trainer_state.json`` as saved (counters whole numbers >= 0, an ``optimizer`` object), else a DataError."""
    if not isinstance(state, dict):
        raise DataError(path, "not a trainer state (a JSON object was expected)")
    for key, (types, least) in _FIELDS.items():
        if key not in state:
            if key in _COUNTS:
                raise DataError(path, f"no {key!r} field (not a trainer state vlmatch train wrote)")
            continue
        val = state[key]
        if isinstance(val, bool) or not isinstance(val, types) or (least is not None and val is not None
                                                                    and val < least):
            want = "a whole number" if types == (int,) else "a number"
            least_text = f" >= {least}" if least is not None else ""
            raise DataError(path, f"{key} is {val!r}; it must be {want}{least_text} {EDITED}")
    if not isinstance(state.get("optimizer"), dict):
        raise DataError(path, f"no optimizer state (an 'optimizer' object) in it {EDITED}")
    if state.get("config") is not None and not isinstance(state["config"], dict):
        raise DataError(path, f"config is {str(state['config'])[:40]!r}; it must be the run's configuration (an "
                              f"object) {EDITED}")
    if not math.isfinite(state.get("best_rsum", 0.0)):
        raise DataError(path, f"best_rsum is {state['best_rsum']!r}; it must be a finite number {EDITED}")
    return state
