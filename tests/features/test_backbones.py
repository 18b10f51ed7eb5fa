"""The EfficientNet-Lite backbone's fast path (folded batch norms, NHWC layout, micro-batches) computes the
network as published."""

import pytest
import torch

from vlmatch.features.backbones import create_backbone, fold_batch_norms, fold_same_padding

lite = pytest.importorskip("efficientnet_lite_pytorch")


def _random_state(variant: int, seed: int = 0) -> dict:
    """A state of the network's layout with batch norms far from identity (random scale, shift, mean and
    variance), so folding them is not a no-op."""
    g = torch.Generator().manual_seed(seed)
    net = lite.EfficientNet.from_name(f"efficientnet-lite{variant}")
    state = net.state_dict()
    for k, v in state.items():
        if not v.is_floating_point():
            continue
        if k.endswith("running_var"):
            state[k] = torch.rand(v.shape, generator=g) + 0.5
        elif k.endswith(("running_mean", "bias")):
            state[k] = torch.randn(v.shape, generator=g) * 0.1
        elif k.split(".")[-2].startswith("_bn"):
            state[k] = torch.rand(v.shape, generator=g) + 0.5
    return state


@pytest.mark.parametrize("variant", [0, 2])
def test_the_folded_nhwc_backbone_equals_the_published_network(tmp_path, variant):
    torch.manual_seed(variant)
    state = _random_state(variant)
    weights = tmp_path / "w.pth"
    torch.save(state, weights)
    reference = lite.EfficientNet.from_name(f"efficientnet-lite{variant}")
    reference.load_state_dict(state)
    reference.eval()
    bb = create_backbone(f"efficientnet-lite{variant}", weights=str(weights), input_size=96)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in bb.modules())
    x = torch.randn(5, 3, 96, 96)
    with torch.no_grad():
        want = reference.extract_features(x).flatten(2).transpose(1, 2)
        got = bb(x)
    assert got.shape == (5, 9, 1280)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_every_batch_norm_of_the_network_is_folded():
    net = lite.EfficientNet.from_name("efficientnet-lite0").eval()
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    assert fold_batch_norms(net) == n_bn > 40
    assert fold_batch_norms(net) == 0  # nothing left to fold


@pytest.mark.parametrize("size", [260, 320])
def test_symmetric_same_paddings_move_into_their_convolutions(size):
    """Every symmetric pad becomes the convolution's own padding (the same function: the equality test above runs
    the folded network); the asymmetric ones (stride 2 over an even input) are kept as they are."""
    net = lite.EfficientNet.from_name("efficientnet-lite2").eval()
    pads = [m.static_padding.padding for m in net.modules() if isinstance(getattr(m, "static_padding", None),
                                                                          torch.nn.ZeroPad2d)]
    symmetric = sum(p[0] == p[1] and p[2] == p[3] for p in pads)
    assert 0 < symmetric < len(pads)  # the network has both kinds
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        want = net.extract_features(x)
        assert fold_same_padding(net) == symmetric
        assert fold_same_padding(net) == 0
        got = net.extract_features(x)
    left = [m.static_padding.padding for m in net.modules() if isinstance(getattr(m, "static_padding", None),
                                                                          torch.nn.ZeroPad2d)]
    assert len(left) == len(pads) - symmetric and all(p[0] != p[1] for p in left)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_micro_batches_do_not_change_an_image_s_features(tmp_path):
    weights = tmp_path / "w.pth"
    torch.save(_random_state(0, seed=3), weights)
    bb = create_backbone("efficientnet-lite0", weights=str(weights), input_size=64)
    x = torch.randn(5, 3, 64, 64)
    with torch.no_grad():
        bb.cpu_micro_batch = 5
        whole = bb(x)
        bb.cpu_micro_batch = 2
        split = bb(x)
        alone = torch.cat([bb(x[i:i + 1]) for i in range(5)])
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone, whole, rtol=1e-5, atol=1e-5)
