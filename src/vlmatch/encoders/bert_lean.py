"""A lean inference forward of a frozen BERT encoder, for encoding search queries one at a time.

For a dozen-token query the Hugging Face forward spends most of its time outside arithmetic (packing weights
anew, dispatching modules). This TorchScript graph holds the same weights (query, key and value fused), frozen
and optimised for inference, and computes ``BertModel``'s equations in float32: :func:`lean_forward` checks it
on a probe and returns ``None`` (the Hugging Face forward is kept) where it differs by more than
:data:`TOLERANCE` or TorchScript fails.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TOLERANCE = 1e-4  # max |lean - Hugging Face| over the probe's token vectors (float32 rounding: ~1e-6)
ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}  # HF name -> F.gelu approximate


class _Layer(nn.Module):
    def __init__(self, layer, heads: int, eps: float, approximate: str):
        super().__init__()
        att = layer.attention
        self.heads = heads
        self.eps = eps
        self.approximate = approximate
        self.qkv = nn.Linear(att.self.query.in_features, 3 * att.self.query.out_features)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]))
            self.qkv.bias.copy_(torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]))
        self.out = att.output.dense
        self.norm1 = att.output.LayerNorm
        self.up = layer.intermediate.dense
        self.down = layer.output.dense
        self.norm2 = layer.output.LayerNorm

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = F.layer_norm(x + self.out(a.transpose(1, 2).reshape(b, n, h)), (h,), self.norm1.weight,
                         self.norm1.bias, self.eps)
        y = self.down(F.gelu(self.up(x), approximate=self.approximate))
        return F.layer_norm(x + y, (h,), self.norm2.weight, self.norm2.bias, self.eps)


class LeanBert(nn.Module):
    """BERT's encoder stack, inference only: ``(tokens (B, L), mask (B, L) bool) -> (B, L, H)``."""

    def __init__(self, model):
        super().__init__()
        cfg = model.config
        emb = model.embeddings
        self.word = emb.word_embeddings
        self.position = emb.position_embeddings
        self.token_type = emb.token_type_embeddings
        self.norm = emb.LayerNorm
        self.eps = float(cfg.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(layer, int(cfg.num_attention_heads), self.eps, ACTIVATIONS[cfg.hidden_act])
                                    for layer in model.encoder.layer)

    def forward(self, tokens: Tensor, mask: Tensor) -> Tensor:
        n = tokens.shape[1]
        pos = torch.arange(n, device=tokens.device)
        x = self.word(tokens) + self.position(pos)[None] + self.token_type.weight[0]
        x = F.layer_norm(x, (x.shape[-1],), self.norm.weight, self.norm.bias, self.eps)
        bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill(~mask, -math.inf)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        return x


def supported(config: dict) -> bool:
    """Whether a config (a folder's config.json) describes a plain BERT encoder this module and
    :class:`.bert_plain.PlainBert` reproduce."""
    return (config.get("model_type") == "bert" and config.get("hidden_act") in ACTIVATIONS
            and config.get("position_embedding_type", "absolute") == "absolute"
            and not config.get("is_decoder", False) and not config.get("add_cross_attention", False)
            and all(isinstance(config.get(k), int) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                             "vocab_size")))


def lean_forward(model, probe: Tensor):
    """A frozen, optimised TorchScript :class:`LeanBert` of ``model`` (a float32 CPU ``BertModel``),
    checked against ``model`` on the token ids ``probe`` (1, L); ``None`` where it is not supported
    or does not reproduce it."""
    p, cfg = next(model.parameters()), getattr(model, "config", None)
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg) if cfg is not None else {}
    if not (supported(cfg) and hasattr(model, "embeddings") and hasattr(model, "encoder")) \
            or p.dtype != torch.float32 or p.device.type != "cpu":
        return None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lean = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(LeanBert(model).eval())))
            mask = torch.ones_like(probe, dtype=torch.bool)
            want = model(input_ids=probe, attention_mask=mask.long()).last_hidden_state
            for _ in range(2):  # the first calls of a frozen graph run its profiling passes
                got = lean(probe, mask)
    except Exception:  # a TorchScript or oneDNN build that cannot run it: keep the Hugging Face forward
        return None
    if got.shape != want.shape or not float((got - want).abs().max()) <= TOLERANCE:
        return None
    return lean
