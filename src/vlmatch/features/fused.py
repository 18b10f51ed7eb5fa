"""EfficientNet-Lite's convolutions as single oneDNN primitives on CPU: each convolution and its ReLU6 as one
kernel, the weights reordered into oneDNN's layout once per input shape instead of on every call.

What ``torch.compile``'s freezing pass does, without its minutes of compilation, through the operators Inductor
calls. Where they are missing or the fused network does not reproduce the plain one on a probe batch, nothing
is replaced; where they fail later, every call runs the plain convolutions, with a one-line note. A fused layer
keeps its convolution for anything but a float32 CPU batch without autograd; its state-dict keys gain ``.conv``
(load weights before fusing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_SHAPES = 8  # packed copies a layer keeps (input shapes); more distinct shapes start the cache afresh

# (convolution, followed by the block's ReLU6?) of efficientnet-lite-pytorch's modules, batch norms folded first
_LAYERS = (("_conv_stem", True), ("_conv_head", True), ("_expand_conv", True), ("_depthwise_conv", True),
           ("_project_conv", False))


def available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_convolution_pointwise")
            and hasattr(ops, "_reorder_convolution_weight"))


class FusedConv(nn.Module):
    """``conv`` (with its TensorFlow-"same" padding module, if any), then ReLU6 when ``relu6``, as one oneDNN
    primitive, its weights reordered for each input shape it meets, at its first call of that shape."""

    def __init__(self, conv: nn.Conv2d, relu6: bool):
        super().__init__()
        self.conv = conv
        self.relu6 = relu6
        self._args = (list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups)
        self._attr = ("hardtanh", [0.0, 6.0], "") if relu6 else ("none", [], "")
        # packed weights by input shape: a shape the weights were not packed for reorders them on every call
        self._packed: dict[tuple[int, ...], torch.Tensor] = {}
        # weights loaded into the layer later (a state dict) are packed again at the next call
        self.register_load_state_dict_post_hook(_unpack)

    def _pack(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The convolution's weights in oneDNN's layout for inputs of ``shape``, kept for the next call."""
        if len(self._packed) >= _SHAPES:
            self._packed.clear()
        with torch.no_grad():
            w = torch.ops.mkldnn._reorder_convolution_weight(self.conv.weight.detach(), *self._args, list(shape))
        self._packed[shape] = w
        return w

    def __getstate__(self):  # deepcopy, pickle: the packed copies are left out and made again at the next call
        return {**self.__dict__, "_packed": {}}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = (x.device.type == "cpu" and x.dtype == torch.float32 and self.conv.weight.device.type == "cpu"
                and not (torch.is_grad_enabled() and (x.requires_grad or self.conv.weight.requires_grad)))
        if fast and not _FAILED:
            try:
                return self._fused(x)
            except Exception as e:  # noqa: BLE001 -- the private operators may fail on a shape or a build the probe did not meet
                _fall_back(e)
        y = self.conv(x)
        return F.relu6(y) if self.relu6 else y

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        pad = getattr(self.conv, "static_padding", None)
        if pad is not None:
            x = pad(x)
        shape = tuple(x.shape)
        w = self._packed.get(shape)
        if w is None:
            w = self._pack(shape)
        bias = None if self.conv.bias is None else self.conv.bias.detach()
        return torch.ops.mkldnn._convolution_pointwise(x, w, bias, *self._args, *self._attr)


# set by the first error of the fused operators after the probe: every fused layer then runs its plain convolution
_FAILED: list[Exception] = []


def _fall_back(e: Exception) -> None:
    import sys

    if not _FAILED:
        print(f"vlmatch: note: the fused backbone's oneDNN operators failed ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:120] if str(e) else ''}); running the plain convolutions from now on "
              "(the same features, slower)", file=sys.stderr)
    _FAILED.append(e)


def _unpack(layer: FusedConv, incompatible_keys) -> None:
    layer._packed.clear()


def _sites(net: nn.Module) -> list[tuple[nn.Module, str, bool]]:
    """(module, attribute, relu6) of every convolution to fuse; none where a block has a squeeze-and-excitation
    unit (its ReLU6 module is shared with layers that are not convolutions)."""
    sites = []
    for module in net.modules():
        here = [(module, name, act) for name, act in _LAYERS if isinstance(getattr(module, name, None), nn.Conv2d)]
        if here and (hasattr(module, "_se_reduce") or not isinstance(getattr(module, "_swish", None), nn.ReLU6)):
            return []
        sites += here
    return sites


def fuse_conv_relu6(net: nn.Module, probe: torch.Tensor, extract) -> int:
    """Replace the convolutions of the batch-norm-folded ``net`` by :class:`FusedConv` layers (their ReLU6 modules
    dropped) where ``extract(probe)`` then gives what it gave before, else undo; returns how many were fused."""
    sites = _sites(net) if available() else []
    if not sites:
        return 0
    with torch.no_grad():
        want = extract(probe)
    swishes = {m: m._swish for m in net.modules() if isinstance(getattr(m, "_swish", None), nn.ReLU6)}
    try:
        for module, name, act in sites:
            setattr(module, name, FusedConv(getattr(module, name), act))
        for m in swishes:
            m._swish = nn.Identity()
        with torch.no_grad():
            got = extract(probe)
        # assert_close's test (|got - want| <= atol + rtol |want|), written out: torch.testing imports torch's
        # distributed tensors on first use (most of a second of `vlmatch explain`'s start)
        atol = 1e-4 * float(want.abs().max()) + 1e-6
        if got.shape != want.shape or not bool(((got - want).abs() <= atol + 1e-4 * want.abs()).all()):
            raise ValueError("the fused network does not reproduce the plain one")
    except Exception:  # noqa: BLE001 -- any failure of the operators or the probe leaves the network as it was
        _undo(sites, swishes)
        return 0
    return len(sites)


def _undo(sites, swishes) -> None:
    for module, name, _ in sites:
        layer = getattr(module, name)
        if isinstance(layer, FusedConv):
            setattr(module, name, layer.conv)
    for m, swish in swishes.items():
        m._swish = swish
