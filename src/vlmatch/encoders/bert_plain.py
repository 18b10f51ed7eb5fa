"""A frozen BERT read from a folder's ``config.json`` and ``model.safetensors`` without ``transformers``, and its
tokenizer from ``tokenizer.json`` with the ``tokenizers`` library alone.

Importing ``transformers``' BERT costs about two seconds, which every command-line search would pay. :class:`PlainBert`
holds the same modules under the same names as ``BertModel`` (LoRA and :mod:`.bert_lean` find their layers) and
gives its token vectors up to float rounding; :func:`plain_bert` returns ``None`` for a folder it does not
reproduce (loaded through ``transformers`` then). :class:`FastTokenizer` gives ``transformers``' ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .bert_lean import ACTIVATIONS, supported

BERT_TOKENIZERS = ("BertTokenizer", "BertTokenizerFast")


class _Output(SimpleNamespace):
    last_hidden_state: Tensor


def _tree(**children: nn.Module) -> nn.Module:
    """A module holding ``children`` under their names: BertModel's layout, whose parameter names it gives."""
    m = nn.Module()
    for name, child in children.items():
        m.add_module(name, child)
    return m


def _layer(h: int, inter: int, eps: float) -> nn.Module:
    return _tree(attention=_tree(self=_tree(query=nn.Linear(h, h), key=nn.Linear(h, h), value=nn.Linear(h, h)),
                                 output=_tree(dense=nn.Linear(h, h), LayerNorm=nn.LayerNorm(h, eps=eps))),
                 intermediate=_tree(dense=nn.Linear(h, inter)),
                 output=_tree(dense=nn.Linear(inter, h), LayerNorm=nn.LayerNorm(h, eps=eps)))


class PlainBert(nn.Module):
    """BERT's encoder for inference: ``model(input_ids=, attention_mask=).last_hidden_state`` (B, L, H), as
    ``transformers``' ``BertModel`` gives it (see the module doc)."""

    def __init__(self, config: dict, pooler: bool = True):
        super().__init__()
        cfg = SimpleNamespace(**{"pad_token_id": 0, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                                 "max_position_embeddings": 512, "position_embedding_type": "absolute",
                                 "is_decoder": False, "intermediate_size": 4 * config["hidden_size"], **config})
        self.config = cfg
        self.approximate = ACTIVATIONS[cfg.hidden_act]
        self.heads = int(cfg.num_attention_heads)
        h = cfg.hidden_size
        self.embeddings = _tree(word_embeddings=nn.Embedding(cfg.vocab_size, h, padding_idx=cfg.pad_token_id),
                                position_embeddings=nn.Embedding(cfg.max_position_embeddings, h),
                                token_type_embeddings=nn.Embedding(cfg.type_vocab_size, h),
                                LayerNorm=nn.LayerNorm(h, eps=cfg.layer_norm_eps))
        self.encoder = _tree(layer=nn.ModuleList(_layer(h, cfg.intermediate_size, cfg.layer_norm_eps)
                                                 for _ in range(cfg.num_hidden_layers)))
        if pooler:  # kept as BertModel has it (its weights are in the folder); its output is never used here
            self.pooler = _tree(dense=nn.Linear(h, h))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> _Output:
        b, n = input_ids.shape
        emb = self.embeddings
        x = emb.word_embeddings(input_ids) + emb.token_type_embeddings.weight[0]
        x = x + emb.position_embeddings(torch.arange(n, device=input_ids.device))[None]
        x = emb.LayerNorm(x)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        h = x.shape[-1]
        for layer in self.encoder.layer:
            att = layer.attention
            q, k, v = (lin(x).view(b, n, self.heads, h // self.heads).transpose(1, 2)
                       for lin in (att.self.query, att.self.key, att.self.value))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, n, h)
            x = att.output.LayerNorm(att.output.dense(a) + x)
            y = layer.output.dense(F.gelu(layer.intermediate.dense(x), approximate=self.approximate))
            x = layer.output.LayerNorm(y + x)
        return _Output(last_hidden_state=x)


def plain_bert(path, config: dict) -> PlainBert | None:
    """The folder's frozen BERT as a :class:`PlainBert` (eval mode, no gradients), its weights read from
    ``model.safetensors``; None where the folder is not one it reproduces (load it with ``transformers``)."""
    from safetensors.torch import load_file

    f = Path(path) / "model.safetensors"
    if not supported(config) or not f.is_file():
        return None
    state = load_file(str(f))
    if any(k.startswith("bert.") for k in state):  # saved from a model with a head (BertForMaskedLM, ...)
        state = {k[5:]: v for k, v in state.items() if k.startswith("bert.")}
    state.pop("embeddings.position_ids", None)  # a buffer older transformers saved
    from ..weights import meta_build

    with meta_build():  # no initialisation only to be overwritten: the file's tensors are assigned
        model = PlainBert(config, pooler="pooler.dense.weight" in state)
    if set(state) != set(model.state_dict()) or any(state[k].shape != v.shape for k, v in model.state_dict().items()):
        return None
    model.load_state_dict(state, strict=True, assign=True)
    return model.float().eval().requires_grad_(False)


class FastTokenizer:
    """A BERT tokenizer read from ``tokenizer.json`` with the ``tokenizers`` library alone, called as the
    ``transformers`` tokenizer is by :class:`vlmatch.encoders.hf.HFTextEncoder`."""

    def __init__(self, path):
        import tokenizers

        path = Path(path)
        self._tk = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tk.no_padding()
        self._tk.no_truncation()
        model = json.loads(self._tk.to_str()).get("model", {})
        self.unk_token = model.get("unk_token")
        self.unk_token_id = None if self.unk_token is None else self._tk.token_to_id(self.unk_token)

    def __len__(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def __call__(self, texts, truncation: bool = False, max_length: int | None = None, padding: bool = False,
                 add_special_tokens: bool = True) -> dict:
        if padding:
            raise ValueError("FastTokenizer does not pad (pad_tokens does)")
        if truncation and max_length is not None:
            self._tk.enable_truncation(max_length)
        else:
            self._tk.no_truncation()
        one = isinstance(texts, str)
        enc = self._tk.encode_batch([texts] if one else list(texts), add_special_tokens=add_special_tokens)
        ids = [e.ids for e in enc]
        return {"input_ids": ids[0] if one else ids}

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self._tk.id_to_token(int(i)) for i in ids]


def fast_tokenizer(path) -> FastTokenizer | None:
    """The folder's tokenizer as a :class:`FastTokenizer` when it is a BERT tokenizer with a tokenizer.json
    (what ``transformers`` itself would run); None otherwise (load it with ``transformers``)."""
    path = Path(path)
    try:
        conf = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        spec = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(conf, dict) or not isinstance(spec, dict) or conf.get("tokenizer_class") not in BERT_TOKENIZERS:
        return None
    norm = spec.get("normalizer") or {}
    if (spec.get("model") or {}).get("type") != "WordPiece" or norm.get("type") != "BertNormalizer":
        return None
    for key, norm_key in (("do_lower_case", "lowercase"), ("strip_accents", "strip_accents"),
                          ("tokenize_chinese_chars", "handle_chinese_chars")):
        if key in conf and conf[key] != norm.get(norm_key):  # transformers would rebuild the normaliser
            return None
    try:
        return FastTokenizer(path)
    except Exception:  # a tokenizer.json the library cannot read: transformers names the problem
        return None
