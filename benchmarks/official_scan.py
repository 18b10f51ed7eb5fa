"""The official SCAN evaluation's way of scoring (github.com/kuanghuei/SCAN, evaluation.py +
model.py), re-written from its description for side-by-side timing: blocks of 128 images x 128
captions (``shard_xattn_t2i``), and inside a block one caption at a time against all its images
(``xattn_score_t2i``: repeat the caption, ``func_attention`` with bmm, cosine, pool), in the dtype
of the numpy arrays it is given (float64 in the official pipeline). Used only by benchmarks."""

from __future__ import annotations

import numpy as np
import torch


def _l2norm(x, dim, eps=1e-8):
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


def _func_attention(query, context, smooth, eps=1e-8):
    batch, query_len = query.shape[0], query.shape[1]
    source_len = context.shape[1]
    attn = torch.bmm(context, query.transpose(1, 2))  # (b, sourceL, queryL)
    attn = torch.nn.functional.leaky_relu(attn, 0.1)  # clipped_l2norm
    attn = _l2norm(attn, 2)
    attn = attn.transpose(1, 2).contiguous().view(batch * query_len, source_len)
    attn = torch.softmax(attn * smooth, dim=1).view(batch, query_len, source_len)
    weighted = torch.bmm(context.transpose(1, 2), attn.transpose(1, 2)).transpose(1, 2)
    return weighted


def _cosine(x1, x2, dim, eps=1e-8):
    w12 = (x1 * x2).sum(dim)
    w1, w2 = x1.norm(2, dim), x2.norm(2, dim)
    return w12 / (w1 * w2).clamp(min=eps)


def xattn_score_t2i(images, captions, cap_lens, lambda_softmax=9.0):
    sims = []
    n_image = images.shape[0]
    for i in range(captions.shape[0]):
        n_word = int(cap_lens[i])
        cap_i = captions[i, :n_word].unsqueeze(0).repeat(n_image, 1, 1)
        weighted = _func_attention(cap_i, images, lambda_softmax)
        row = _cosine(cap_i, weighted, dim=2).mean(dim=1, keepdim=True)  # AVG
        sims.append(row)
    return torch.cat(sims, 1)


def shard_xattn_t2i(images: np.ndarray, captions: np.ndarray, cap_lens, shard_size=128):
    d = np.zeros((len(images), len(captions)))
    for i in range(0, len(images), shard_size):
        for j in range(0, len(captions), shard_size):
            im = torch.from_numpy(images[i:i + shard_size])
            s = torch.from_numpy(captions[j:j + shard_size])
            d[i:i + shard_size, j:j + shard_size] = xattn_score_t2i(im, s, cap_lens[j:j + shard_size]).numpy()
    return d
