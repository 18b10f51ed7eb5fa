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


class _WithTransformer(torch.nn.Module):
    """A model with a layer of its own and a (fake, tiny) fine-tuned pretrained text encoder."""

    def __init__(self):
        super().__init__()
        from vlmatch.encoders.hf import HFTextEncoder

        self.head = torch.nn.Linear(4, 3)
        self.text = HFTextEncoder.__new__(HFTextEncoder)  # no folder needed: only its parameters matter here
        torch.nn.Module.__init__(self.text)
        self.text.layer = torch.nn.Linear(3, 3)


def test_the_pretrained_transformer_trains_at_its_own_scale_of_the_epochs_lr():
    from vlmatch.training.loop import lr_at, param_groups, set_lr

    model = _WithTransformer()
    tc = {"optimizer": "adam", "lr": 1e-3, "lr_update": 2, "lr_decay": 0.1, "weight_decay": 0.0,
          "pretrained_lr_scale": 0.02}
    groups = param_groups(model, tc)
    assert [len(g["params"]) for g in groups] == [2, 2]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in model.text.parameters()}
    opt = make_optimizer(groups, tc)
    for epoch, lr in ((0, 1e-3), (2, 1e-4)):
        set_lr(opt, lr_at(tc, epoch))
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([lr, lr * 0.02])
    # one Adam step moves each parameter by about its group's lr (Adam's first step is lr * sign(grad))
    with torch.no_grad():  # from zero, so float32's spacing is far below the moves compared
        for p in model.parameters():
            p.zero_()
            p.grad = torch.ones_like(p)
    opt.step()
    head_move = model.head.weight.abs().max().item()
    text_move = model.text.layer.weight.abs().max().item()
    assert head_move == pytest.approx(1e-4, rel=1e-3) and text_move == pytest.approx(2e-6, rel=1e-3)


def test_without_a_scale_or_a_trained_transformer_there_is_one_group_as_before():
    from vlmatch.training.loop import param_groups

    tc = {"pretrained_lr_scale": 1.0}
    assert len(param_groups(_WithTransformer(), tc)) == 1
    frozen = _WithTransformer()
    frozen.text.requires_grad_(False)
    groups = param_groups(frozen, {"pretrained_lr_scale": 0.1})
    assert len(groups) == 1 and len(groups[0]["params"]) == 2
