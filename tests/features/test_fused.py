"""vlmatch.features.fused: convolution + ReLU6 as one oneDNN primitive with packed weights computes the
unfused network's features, falls back to the plain layers wherever it cannot be used, and undoes itself when
a probe disagrees."""

import copy
import pickle

import pytest
import torch
from torch import nn

from vlmatch.features import fused
from vlmatch.features.backbones import create_backbone, fold_batch_norms, fold_same_padding

lite = pytest.importorskip("efficientnet_lite_pytorch")
needs_onednn = pytest.mark.skipif(not fused.available(), reason="this PyTorch build has no oneDNN operators")


def _net(seed=0):
    torch.manual_seed(seed)
    net = lite.EfficientNet.from_name("efficientnet-lite0").eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):  # far from identity, so folding them is not a no-op
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
    fold_batch_norms(net)
    fold_same_padding(net)
    return net.to(memory_format=torch.channels_last)


def _extract(net):
    return lambda x: net.extract_features(x.contiguous(memory_format=torch.channels_last))


def _layers(net):
    return sum(isinstance(m, fused.FusedConv) for m in net.modules()), sum(isinstance(m, nn.ReLU6)
                                                                            for m in net.modules())


@needs_onednn
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_the_fused_network_gives_the_unfused_features_at_any_batch(batch):
    """Packed for batches of 2 at 64 px; run on other batch sizes and another input size too."""
    net = _net()
    with torch.no_grad():
        x = torch.randn(batch, 3, 96, 96)
        want = _extract(net)(x)
        n = fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net))
        got = _extract(net)(x)
    assert n == _layers(net)[0] == 49 and _layers(net)[1] == 0  # every convolution; the ReLU6 modules absorbed
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@needs_onednn
def test_under_autograd_the_plain_layers_run_and_give_the_same_gradient():
    net = _net(1)
    x = torch.randn(1, 3, 64, 64)
    xa = x.clone().requires_grad_()
    _extract(net)(xa).square().sum().backward()
    fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net))
    xb = x.clone().requires_grad_()
    _extract(net)(xb).square().sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5 * float(xa.grad.abs().max()))


@needs_onednn
def test_a_probe_that_disagrees_undoes_the_fusion():
    net = _net(2)
    plain = _extract(net)
    calls = []

    def extract(x):  # the second call (the fused network) returns something else
        calls.append(1)
        y = plain(x)
        return y if len(calls) == 1 else y + 1

    before = _layers(net)
    assert fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), extract) == 0
    assert _layers(net) == before == (0, before[1]) and before[1] > 0


def test_nothing_is_fused_without_the_operators_or_with_a_squeeze_and_excitation_unit(monkeypatch):
    net = _net(3)
    monkeypatch.setattr(fused, "available", lambda: False)
    assert fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net)) == 0
    monkeypatch.setattr(fused, "available", lambda: True)
    block = next(m for m in net.modules() if hasattr(m, "_depthwise_conv"))
    block._se_reduce = nn.Conv2d(4, 4, 1)  # its ReLU6 would be shared with a layer that is not fused
    assert fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net)) == 0
    assert _layers(net)[0] == 0


@needs_onednn
def test_the_shipped_backbones_are_fused():
    # the stem, the head and 16 blocks' convolutions (the first block has no expansion)
    assert create_backbone("efficientnet-lite0", input_size=64).fused_layers == 2 + 16 * 3 - 1


@needs_onednn
def test_inference_takes_the_fused_path_and_a_copy_or_new_weights_repack():
    """Under inference mode no original convolution runs (the fused primitive does); a deepcopy and a pickle
    round trip work (the opaque packed weights are left out and packed again), and weights loaded afterwards are
    the ones used."""
    net = _net(4)
    x = torch.randn(2, 3, 64, 64)
    fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net))

    def boom(*a):
        raise AssertionError("the plain convolution ran")

    clone = copy.deepcopy(net)
    again = pickle.loads(pickle.dumps(net))
    layers = [m for m in net.modules() if isinstance(m, fused.FusedConv)]
    for layer in layers:
        layer.conv.forward = boom
    with torch.inference_mode():
        got = _extract(net)(x)
        assert all(len(m._packed) == 1 for m in layers)  # the probe's shape: packed once, at fusion
        torch.testing.assert_close(_extract(net)(x[:1]), got[:1], rtol=1e-5, atol=1e-5)
        assert all(len(m._packed) == 2 for m in layers)  # a batch of one is packed for too, and kept
        torch.testing.assert_close(_extract(clone)(x), got, rtol=0, atol=0)
        torch.testing.assert_close(_extract(again)(x), got, rtol=0, atol=0)
    other = _net(5)  # other weights, loaded into the fused copy through its (fused) state-dict layout
    fused.fuse_conv_relu6(other, torch.randn(2, 3, 64, 64), _extract(other))
    clone.load_state_dict(other.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(_extract(clone)(x), _extract(other)(x), rtol=1e-5, atol=1e-5)
        assert (_extract(clone)(x) - got).abs().max() > 1e-3


@needs_onednn
def test_an_operator_error_after_the_probe_falls_back_per_call(monkeypatch, capsys):
    """The private operators failing on a later call (a shape or a build the probe did not meet) do not fail the
    extraction: that call and the later ones run the plain convolutions, with a one-line note."""
    net = _net(2)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = _extract(net)(x)
    fused.fuse_conv_relu6(net, torch.randn(2, 3, 64, 64), _extract(net))
    monkeypatch.setattr(fused, "_FAILED", [])
    calls = []

    def broken(self, x):
        calls.append(1)
        raise RuntimeError("could not create a primitive descriptor")

    monkeypatch.setattr(fused.FusedConv, "_fused", broken)
    with torch.inference_mode():
        got = _extract(net)(x)
        again = _extract(net)(x[:1])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    torch.testing.assert_close(again, want[:1], rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert len(calls) == 1  # tried once, then the plain path for every layer and call
    err = capsys.readouterr().err
    assert err.count("vlmatch: note: the fused backbone's oneDNN operators failed (RuntimeError") == 1


def test_torch_is_bounded_to_the_versions_tested():
    """The fused path calls private oneDNN operators: pyproject bounds torch above, and this torch is inside."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.version import Version

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    req = next(Requirement(r) for r in meta["project"]["dependencies"] if Requirement(r).name == "torch")
    assert any(s.operator in ("<", "<=") for s in req.specifier), f"{req} has no upper bound"
    assert Version(torch.__version__.split("+")[0]) in req.specifier
