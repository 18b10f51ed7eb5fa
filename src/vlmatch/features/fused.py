"""EfficientNet-Lite's convolutions as single oneDNN primitives on CPU: each convolution and the ReLU6 after it
run as one kernel (the activation applied while the output is still in registers: no second pass over it),
with the weights reordered into oneDNN's blocked layout once per input shape, instead of on every call.

This is what ``torch.compile``'s freezing pass does for a CPU convolutional network, without its minutes of
compilation on 2 cores (an index build is a one-off job). It uses the two operators Inductor itself calls
(``torch.ops.mkldnn._convolution_pointwise`` and ``_reorder_convolution_weight``); where they are missing (a
build of PyTorch without oneDNN, another version), or the fused network does not give the unfused one's output
on a probe batch, nothing is replaced and the backbone runs as before; where they fail on a later call (an input
shape or a machine the probe did not meet), that call and every later one run the plain convolutions, with a
one-line note. The network computes the same function: oneDNN runs the same convolution kernels either way (the
probe compares to float rounding).

A fused layer keeps its original convolution and uses it for anything but a float32 CPU batch without autograd,
so a backbone moved to another device or differentiated still works. The packed weights are a copy made once (the
backbone is never trained): a state dict loaded into the network, a deepcopy or an unpickled backbone packs them
again at its next call; weights edited in place by hand are not seen until then. The network's state-dict keys
gain a ``.conv`` (``_conv_stem.conv.weight``) where a layer is fused: load weights before fusing, as
``EfficientNetLite`` does.
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
        # packed weights by input shape: oneDNN picks its blocked layout for a shape, and a call with a shape the
        # weights were not packed for reorders them every time (a batch of one photo ran 1.45x slower per image)
        self._packed: dict[tuple[int, ...], torch.Tensor] = {}
        # weights loaded into the layer later (a state dict) are packed again at the next call
        self.register_load_state_dict_post_hook(_unpack)

    def _pack(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The convolution's weights in oneDNN's layout for inputs of ``shape`` (an opaque tensor: no storage to
        copy or save), kept for the next call of that shape (a few shapes: a build's micro-batches, a query's 1)."""
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


# Set by the first error of the fused operators after the probe (an input shape or a machine the probe did not
# meet): from then on every fused layer of the process runs its plain convolution, the call that failed included.
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
    """Replace the convolutions of the (batch-norm-folded) EfficientNet-Lite ``net`` by :class:`FusedConv` layers
    and drop the ReLU6 modules they absorb, if ``extract(probe)`` then equals what it was before (else undo); that
    check packs each layer's weights for ``probe``'s shapes. ``extract`` runs the network on a batch. Returns how
    many were fused."""
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
