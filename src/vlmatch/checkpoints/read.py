"""Reading a checkpoint folder: read once, each file checked, before and as a model is built from it.

A checkpoint folder holds ``config.json`` (the registered model name, its options and the weights'
SHA-256), ``model.safetensors``, ``checksums.json`` (every file's SHA-256: :mod:`.seal`) and, as the
model has them, ``vocab.json``, the text encoder's record and tokenizer copy, the calibration and the LoRA
adapters (inside the weights); a training checkpoint adds the optimiser (``optimizer.safetensors``) and the
trainer state (``trainer_state.json``). JSON and safetensors only: never pickle. Loading goes through this
module only, in this order (each check names the file and what is wrong in one line, before anything is
allocated where it can):

1. :func:`checkpoint_folder`: ``pretrained:NAME`` resolved (:func:`register_resolver`), an interrupted
   save's ``NAME.prev`` taken, a run folder refused with the checkpoints inside it named;
2. :func:`read_checkpoint`: ``config.json`` read once (its options are checked by the registry, which
   knows the names);
3. :meth:`Checkpoint.read_weights`: the safetensors header (shapes; no tensor data) and the weights'
   SHA-256 against config.json, each read once;
4. :func:`build_model`: the model built ONCE, on the meta device (no memory), its shapes compared with the
   header, then its tensors replaced by the file's (no copy; a model that cannot be built on the meta
   device is built for real and its weights checked by shape as they load);
5. :func:`finish_model`: the vocabulary (read once per content in this process: :func:`read_vocab`), the
   model's own files (text encoder record, tokenizer: :meth:`MatchingModel.load_extra`), then every file
   against checksums.json.

``registry.load_model`` runs the five steps, then attaches the calibration (:mod:`vlmatch.models.calibration`:
it must name these weights); an index's model copies, ``pretrained:NAME`` and training's ``init_from`` /
resume (:func:`load_weights_into`, :func:`load_training_state`) read their weights through the same functions.
This module never imports :mod:`vlmatch.models` (what is model-specific reaches it as ``create`` or a method of
the model) and imports no torch at import time (the command line resolves ``--model`` arguments with it).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from ..io import complete_dir, read_json
from .seal import CHECKSUMS, unsealed_problem, verify_checkpoint

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


def checkpoint_folder(spec) -> Path:
    """The checkpoint folder ``spec`` names (step 1 of the module doc)."""
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
    """What a checkpoint folder holds, each file read once: ``config`` (config.json), then (after
    :meth:`read_weights`) the weights' ``header`` (name -> shape) and ``weights_sha256`` (verified)."""

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
        """The safetensors header and the weights' SHA-256, checked against config.json (step 3)."""
        self.header, self.weights_sha256 = read_weights_header(self.weights, self.config.get("weights_sha256"),
                                                               self.config_path)
        return self


def read_config_json(path) -> dict:
    path = Path(path)
    obj = read_json(path, "config.json not found (is this a vlmatch checkpoint folder?)")
    if not isinstance(obj, dict) or "name" not in obj or "config" not in obj:
        raise DataError(path, "expected an object with 'name' and 'config'")
    return obj


def read_checkpoint(spec) -> Checkpoint:
    """Steps 1 and 2: the folder and its config.json (an object with 'name' and an object 'config')."""
    d = checkpoint_folder(spec)
    cfg = read_config_json(d / "config.json")
    if not isinstance(cfg["config"], dict):
        raise DataError(d / "config.json", "'config' must be an object of model options")
    return Checkpoint(d, cfg)


def read_weights_header(path, expected_sha256: str | None, recorded_in) -> tuple[dict, str]:
    """(name -> shape, SHA-256) of a safetensors file, the digest checked against ``expected_sha256``
    (recorded in ``recorded_in``) when given. A file that is no safetensors at all is named as such first."""
    from ..weights import read_header, sha256_file, verify_sha256

    header = read_header(path)
    digest = sha256_file(path)
    verify_sha256(path, expected_sha256, recorded_in, actual=digest)
    return header, digest


def fit_problems(header: dict, expected: dict) -> list[str]:
    """What differs between a file's shapes and a model's, leaving out the pooler adapters an older save
    holds (load_state drops them)."""
    from ..encoders.lora import unused_pooler_keys
    from ..weights import shape_problems

    legacy = set(unused_pooler_keys(header)) - set(expected)
    return shape_problems({k: v for k, v in header.items() if k not in legacy}, expected)


def load_state(model, path, header: dict) -> None:
    """Fill ``model`` with the tensors of ``path`` (shapes already checked against ``header``); an older
    save's pooler adapters are dropped (refused if they are not zero). Parameters on the meta device are
    replaced by the loaded tensors (no copy)."""
    from safetensors.torch import load_file

    from ..encoders.lora import drop_unused_pooler, unused_pooler_keys

    try:
        state = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(path, f"not a readable safetensors file: {e}") from None
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
    """Step 4: ``create(name, **options)`` run once on the meta device, its shapes compared with the
    header (a config.json whose sizes do not fit the weights, or are absurd, allocates nothing), then its
    tensors replaced by the file's (``load_state_dict(assign=True)``: nothing is initialised only to be
    overwritten). A model whose construction needs real tensors, or that keeps a tensor outside its state
    dict, is built for real instead, and its weights checked by shape as they load. A frozen pretrained
    transformer, outside the parameter tree, is loaded for real by its encoder during the build."""
    from ..weights import describe_problems, meta_build

    try:
        with meta_build():
            model = create(ck.name, **ck.options)
    except DataError:
        raise
    except Exception:  # a model whose construction needs real tensors
        model = None
    if model is None:
        model = create(ck.name, **ck.options)
        load_weights_into(model, ck.weights, ck.weights_sha256)
        return model
    problems = fit_problems(ck.header, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    if problems:
        raise DataError(ck.weights, f"weights do not fit {ck.config_path} (model {ck.name}): "
                                    f"{describe_problems(problems)}")
    load_state(model, ck.weights, ck.header)  # every meta tensor replaced by the file's (strict: all of them)
    left = [k for k, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:  # a tensor the file does not hold (a buffer kept out of the state dict): build it for real
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
    """Step 5: vocabulary, the model's own files, the sealed file list. A folder without checksums.json that
    is not an older save (saved sealed, or its format removed since: :func:`.seal.unsealed_problem`) is refused.
    The caller attaches the calibration next (it must name these weights, whatever the seal says:
    ``registry.load_model``)."""
    d = ck.folder
    if (d / "vocab.json").is_file():
        model.vocab = read_vocab(d / "vocab.json")
        size = getattr(model.cfg, "vocab_size", None)
        if model.uses_vocab and size is not None and len(model.vocab) > size:
            raise DataError(d / "vocab.json", f"{len(model.vocab)} words, but the model's vocab_size in config.json "
                                              f"is {size}: this vocabulary does not belong to these weights")
    model.load_extra(d)  # (its text encoder's record: the encoder it names must be the one installed)
    # every file against checksums.json (the checks above name what does not make sense; this, what was
    # changed, removed or copied in since the save), before the calibration is attached
    if verify_checkpoint(d, known={"model.safetensors": ck.weights_sha256}) is None:
        problem = unsealed_problem(d, ck.config)
        if problem is not None:
            raise problem
        if note_unsealed:
            _unsealed(d)
    return model


def verify_sealed(folder) -> dict[str, str] | None:
    """Every file of the checkpoint folder ``folder`` against its checksums.json (:func:`.seal.verify_checkpoint`);
    a folder saved sealed (its config.json's format) but found without one is refused in one line naming it
    (:func:`.seal.missing_seal`), and so is one whose format was removed (:func:`.seal.unsealed_problem`). None only
    for a folder saved before vlmatch sealed them (its weights are still checked against config.json as they load)."""
    files = verify_checkpoint(folder)
    if files is None:
        problem = unsealed_problem(folder, read_config_json(Path(folder) / "config.json"))
        if problem is not None:
            raise problem
    return files


_WARNED: set[Path] = set()


def _unsealed(d: Path) -> None:
    """Say once per folder that a checkpoint has no checksums.json (saved before vlmatch sealed them): its
    weights are still checked against config.json, its other files are not."""
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
    """``ckpt/trainer_state.json``, checked for type (:func:`check_state`): a DataError naming the file and field."""
    state_file = Path(ckpt) / "trainer_state.json"
    return check_state(state_file, read_json(state_file, "trainer state not found"))


def load_training_state(path, model, optimizer) -> dict:
    """Resume from the training checkpoint ``path`` (``last/``, or the ``last.prev`` an interrupted swap left):
    the trainer state checked, the folder whole against its checksums.json, then the model's weights, the
    optimiser's state and the RNG loaded. Returns the trainer state (its scalars)."""
    import torch
    from safetensors.torch import load_file

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
    try:
        tensors = load_file(str(d / "optimizer.safetensors"))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(d / "optimizer.safetensors", f"not a readable safetensors file: {e}") from None
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
    """The ``optimizer`` object of a trainer state: ``param_groups`` (one per group of this run's optimiser,
    each with as many whole-number ``params`` ids) and ``scalars`` (``"ID.name": value``)."""
    def bad(field, problem):
        return DataError(path, f"optimizer.{field} {problem} (the file was edited: restore it, or start the run over "
                               "with --overwrite)")

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
    """``trainer_state.json`` as saved: an object whose counters are whole numbers >= 0 (and
    ``optimizer`` an object); anything else (a hand edit) is a DataError naming the file and field."""
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
            raise DataError(path, f"{key} is {val!r}; it must be {want}" + (f" >= {least}" if least is not None else "")
                            + " (the file was edited: restore it, or start the run over with --overwrite)")
    if not isinstance(state.get("optimizer"), dict):
        raise DataError(path, "no optimizer state (an 'optimizer' object) in it (the file was edited: restore it, or "
                              "start the run over with --overwrite)")
    if state.get("config") is not None and not isinstance(state["config"], dict):
        raise DataError(path, f"config is {str(state['config'])[:40]!r}; it must be the run's configuration (an object) "
                              "(the file was edited: restore it, or start the run over with --overwrite)")
    if not math.isfinite(state.get("best_rsum", 0.0)):
        raise DataError(path, f"best_rsum is {state['best_rsum']!r}; it must be a finite number (the file was edited: "
                              "restore it, or start the run over with --overwrite)")
    return state
