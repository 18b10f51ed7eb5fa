"""Low-rank adapters (LoRA; Hu et al., ICLR 2022) on the linear layers of a frozen pretrained transformer.

Each adapted ``nn.Linear`` computes ``y = x W^T + b + (alpha / r) (x A^T) B^T`` with A (r, in) and B (out, r)
trained (B starts at zero, so the adapted transformer starts as the base one). Forward hooks add the adapters,
so the base weights stay outside the parameter tree (a checkpoint holds only the adapters);
:meth:`LoRAAdapters.merge` folds them into the base weights for inference. ``text_lora: {rank: 8, targets:
[query, value], alpha: 16}`` names the adapted layers by the last parts of their module names.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

DEFAULT_TARGETS = ("query", "value")
KEYS = ("rank", "targets", "alpha")


@dataclass(frozen=True)
class LoRASpec:
    rank: int = 8
    targets: tuple[str, ...] = DEFAULT_TARGETS
    alpha: float = 16.0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def record(self) -> dict:
        """The spec as JSON values (what a checkpoint's text_encoder.json records)."""
        d = asdict(self)
        d["targets"] = list(self.targets)
        return d


def parse_lora(value, where: str = "text_lora") -> LoRASpec | None:
    """A ``text_lora`` option value -> :class:`LoRASpec` (None: no adapters); ``ValueError`` with one line
    naming the key for anything else."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping {{rank, targets, alpha}} or null, got {value!r}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; known: {list(KEYS)}")
    rank = value.get("rank", LoRASpec.rank)
    if isinstance(rank, float) and rank == int(rank):
        rank = int(rank)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 4096:
        raise ValueError(f"{where}.rank must be an integer from 1 to 4096, got {rank!r}")
    targets = value.get("targets", list(DEFAULT_TARGETS))
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list | tuple) or not targets or not all(isinstance(t, str) and t.strip(".")
                                                                       for t in targets):
        raise ValueError(f"{where}.targets must be a non-empty list of module names (e.g. [query, value]), "
                         f"got {targets!r}")
    alpha = value.get("alpha", 2.0 * rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"{where}.alpha must be a positive number, got {alpha!r}")
    return LoRASpec(rank=rank, targets=tuple(t.strip(".") for t in targets), alpha=float(alpha))


def target_layers(model: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` modules of ``model`` whose names end in one of ``targets`` (whole name parts); the pooler
    only where a target names it (the text side never reads its output, so its adapter would never train)."""
    found = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            if _in_pooler(name) and not any(_in_pooler(t) for t in targets):
                continue
            found[name] = mod
    return found


def _in_pooler(name: str) -> bool:
    return name == "pooler" or name.startswith("pooler.") or ".pooler." in f".{name}"


# an adapter of the unused pooler in older checkpoints: its B is all zeros (it never had a gradient)
_POOLER_ADAPTER = ("lora.layers.pooler__dense.A", "lora.layers.pooler__dense.B")


def unused_pooler_keys(names) -> list[str]:
    """The names of a state dict that are a text side's pooler adapter from before it was left out."""
    return [n for n in names if n.endswith(_POOLER_ADAPTER)]


def drop_unused_pooler(state: dict, where) -> dict:
    """``state`` without a pooler adapter whose B is all zeros (see above); a pooler adapter that is not
    zero was trained by other code: a ValueError naming ``where``."""
    keys = unused_pooler_keys(state)
    for k in keys:
        if k.endswith(".B") and bool(torch.as_tensor(state[k]).any()):
            raise ValueError(f"{where}: {k} is not zero, so the pooler adapter did change the model; this vlmatch "
                             "leaves the pooler out of LoRA and cannot reproduce it")
    return {k: v for k, v in state.items() if k not in keys}


class LoRALayer(nn.Module):
    """A (r, in) and B (out, r) of one adapted linear layer."""

    def __init__(self, base: nn.Linear, rank: int):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's own initialisation

    def delta(self, x: Tensor, scale: float) -> Tensor:
        return (x @ self.A.T) @ self.B.T * scale


class LoRAAdapters(nn.Module):
    """The adapters of ``spec`` on ``model`` (which stays outside this module's parameter tree)."""

    def __init__(self, model: nn.Module, spec: LoRASpec, source: str = "the text encoder"):
        super().__init__()
        self.spec = spec
        layers = target_layers(model, spec.targets)
        if not layers:
            names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
            raise ValueError(f"text_lora.targets {list(spec.targets)} match no linear layer of {source}; "
                             f"its linear layers end in {names}")
        self.layers = nn.ModuleDict({n.replace(".", "__"): LoRALayer(m, spec.rank) for n, m in layers.items()})
        self.merged = False
        self._handles = [m.register_forward_hook(self._hook(n.replace(".", "__"))) for n, m in layers.items()]
        self.__dict__["_base"] = layers  # plain references: the base layers are not this module's

    def _hook(self, key: str):
        def add_delta(module, inputs, output):
            return output + self.layers[key].delta(inputs[0], self.spec.scale)
        return add_delta

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the adapters into the base weights (W += scale B A) for inference; from then on the base
        model alone computes the adapted forward (the hooks are removed). Training after a merge is refused."""
        if self.merged:
            return
        for name, base in self.__dict__["_base"].items():
            lay = self.layers[name.replace(".", "__")]
            base.weight += (lay.B @ lay.A).to(base.weight.dtype) * self.spec.scale
        for handle in self._handles:
            handle.remove()
        self.merged = True

    def digest(self) -> str:
        """SHA-256 of the adapters' values and spec: tells one set of adapters of a base from another."""
        h = hashlib.sha256(repr(self.spec).encode())
        for name, p in sorted(self.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()
