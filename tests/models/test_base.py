"""models/base.py helpers: the unit normalisation every model shares, the eval-mode block."""

import pytest
import torch

from vlmatch.models.base import EPS, l2norm


def _plain(x, dim):
    return x / (torch.linalg.vector_norm(x, dim=dim, keepdim=True) + EPS)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_l2norm_value_and_gradient_equal_autograd_on_its_definition(dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    x[1, :, 2] = 0  # zero vectors along some axes: the gradient is upstream / eps there, not NaN
    x = x.requires_grad_()
    upstream = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    got, want = l2norm(x, dim=dim), _plain(x, dim)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    (gx,), (wx,) = torch.autograd.grad(got, x, upstream), torch.autograd.grad(want, x, upstream)
    assert torch.isfinite(gx).all()
    torch.testing.assert_close(gx, wx, rtol=1e-12, atol=1e-6)  # 1e-6 of values up to 1 / eps = 1e8 at zero


def test_l2norm_gradcheck_and_the_no_grad_path():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: l2norm(t, dim=1), (x,))
    with torch.no_grad():
        torch.testing.assert_close(l2norm(x, dim=1), _plain(x, 1))
    floor = l2norm(x, dim=1, floor=True)  # SMAN's form keeps autograd's own chain
    torch.testing.assert_close(floor, x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp(min=EPS))


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_sets_eval_mode_and_restores_the_mode_before_also_on_an_error(training):
    from vlmatch.models.registry import create_model

    model = create_model("vsepp", embed_dim=8, word_dim=4, img_dim=6, vocab_size=10).train(training)
    with pytest.raises(RuntimeError, match="inside"):
        with model.evaluating():
            assert not model.training and not any(m.training for m in model.modules())
            raise RuntimeError("inside")
    assert model.training is training and all(m.training is training for m in model.modules())
