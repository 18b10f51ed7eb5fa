"""make_optimizer: the fused Adam kernel updates as the plain per-parameter loop does."""

import copy

import pytest
import torch

from vlmatch.training.loop import make_optimizer


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((300, 17), (17,), (5, 4, 3))]


@pytest.mark.parametrize("weight_decay", [0.0, 1e-4])
def test_adam_equals_the_plain_loop_over_steps(weight_decay):
    tc = {"optimizer": "adam", "lr": 1e-2, "lr_update": 10, "weight_decay": weight_decay}
    ours, plain = _params(0), _params(0)
    opt = make_optimizer(ours, tc)
    ref = torch.optim.Adam(plain, lr=1e-2, weight_decay=weight_decay, foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        for p, q, gr in zip(ours, plain, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, plain, strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-6)
    moved = max((p - q).abs().max().item() for p, q in zip(ours, _params(0), strict=True))
    assert moved > 1e-2  # the steps did move the parameters


def test_adam_is_fused_where_torch_has_the_cpu_kernel():
    fused_cpu = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 4)
    opt = make_optimizer(_params(0), {"optimizer": "adam", "lr": 1e-3, "lr_update": 10, "weight_decay": 0.0})
    assert bool(opt.defaults.get("fused")) == fused_cpu


def test_an_optimizer_state_saved_by_the_plain_loop_resumes_in_the_fused_one():
    tc = {"optimizer": "adam", "lr": 1e-2, "lr_update": 10, "weight_decay": 0.0}
    old, new = _params(0), _params(0)
    plain = torch.optim.Adam(old, lr=1e-2, foreach=False)
    for p in old:
        p.grad = torch.ones_like(p)
    plain.step()
    with torch.no_grad():
        for p, q in zip(new, old, strict=True):
            p.copy_(q)
    opt = make_optimizer(new, tc)
    opt.load_state_dict(copy.deepcopy(plain.state_dict()))  # (load_state_dict may share CPU tensors)
    for p, q in zip(new, old, strict=True):
        p.grad, q.grad = torch.full_like(p, 0.5), torch.full_like(q, 0.5)
    plain.step()
    opt.step()
    for p, q in zip(new, old, strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-6)
