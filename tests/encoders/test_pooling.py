"""The image-side pooling operators against plain loops over regions, ranks and dimensions."""

import math

import pytest
import torch

from vlmatch.encoders.pooling import GPO, masked_max, position_encoding


def _loop_position_encoding(k, d):
    pe = [[0.0] * d for _ in range(k)]
    for p in range(1, k + 1):
        for i in range(0, d, 2):
            angle = p / (10000 ** (i / d))
            pe[p - 1][i] = math.sin(angle)
            pe[p - 1][i + 1] = math.cos(angle)
    return torch.tensor(pe)


def test_position_encoding_is_the_sinusoid_of_each_rank():
    torch.testing.assert_close(position_encoding(7, 8), _loop_position_encoding(7, 8), rtol=1e-5, atol=1e-5)


def _loop_gpo(gpo, x, count):
    """Sort each dimension's values over the first `count` regions, weight rank k by theta_k."""
    h, _ = gpo.gru(_loop_position_encoding(count, gpo.d_pe)[None])
    half = h.shape[-1] // 2
    logits = [float(gpo.linear.weight[0] @ ((h[0, k, :half] + h[0, k, half:]) / 2)) / gpo.temperature
              for k in range(count)]
    z = sum(math.exp(v) for v in logits)
    theta = [math.exp(v) / z for v in logits]
    out = []
    for d in range(x.shape[1]):
        values = sorted((float(x[i, d]) for i in range(count)), reverse=True)
        out.append(sum(t * v for t, v in zip(theta, values, strict=True)))
    return torch.tensor(out)


def test_gpo_weights_each_dimension_s_sorted_values_by_rank_and_skips_missing_regions():
    torch.manual_seed(0)
    gpo = GPO(d_pe=8, d_hidden=6)
    x = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [0, 0, 1, 0, 0]]).bool()
    with torch.no_grad():
        got = gpo(x, mask)
        for b in range(3):
            kept = x[b][mask[b]]
            torch.testing.assert_close(got[b], _loop_gpo(gpo, kept, kept.shape[0]), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gpo(x[:1]), got[:1])  # no mask = every region


@pytest.mark.parametrize("logit", [0.0, 50.0])
def test_gpo_spans_mean_and_max(logit):
    """Equal logits give the mean; a dominant first rank gives the max (the two operators it generalises)."""
    gpo = GPO(d_pe=4, d_hidden=4)
    x = torch.randn(2, 6, 3)
    theta = torch.full((6,), 0.0)
    theta[0] = logit
    gpo.rank_weights = lambda counts, k_max: torch.softmax(theta, 0).expand(len(counts), k_max)
    want = x.mean(dim=1) if logit == 0 else x.max(dim=1).values
    torch.testing.assert_close(gpo(x), want, rtol=1e-4, atol=1e-5)


def test_masked_max_ignores_missing_regions():
    x = torch.tensor([[[1.0, -5.0], [9.0, -1.0], [3.0, 2.0]]])
    assert masked_max(x, torch.tensor([[True, False, True]])).tolist() == [[3.0, 2.0]]
    assert masked_max(x, None).tolist() == [[9.0, 2.0]]
