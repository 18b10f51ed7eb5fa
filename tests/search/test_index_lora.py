"""An index whose model has a LoRA text side: queries run the adapters folded into the base weights and score
as the checkpoint does with its adapters applied on the fly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vlmatch
from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch import create_model, load_model
from vlmatch.data.precomp import PrecompSplit
from vlmatch.search.build import build_index

from ..models.test_mmca import toy_words


def test_search_with_lora_adapters_equals_the_checkpoints_own_scores(small_world, tmp_path):
    bert = tiny_bert_folder(tmp_path / "bert", hidden=16, layers=2, heads=2, words=toy_words())
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=32, embed_dim=16, text_encoder=str(bert), text_cache=False,
                     text_lora={"rank": 4, "targets": ["query", "value", "dense"]})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.pretrained_text.hf.lora.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    ckpt = m.save(tmp_path / "ckpt")
    build_index(tmp_path / "idx", ckpt, features=small_world, split="dev", dtype="float32", progress=False,
                ann="flat")
    idx = vlmatch.Index.open(tmp_path / "idx")
    query = "a yellow kite"
    res = idx.search(query, k=5, candidates=1000)
    model = load_model(ckpt).eval()  # adapters applied by hooks, not merged
    assert model.pretrained_text.hf.lora is not None and not model.pretrained_text.hf.lora.merged
    split = PrecompSplit(small_world, "dev")
    feats = torch.from_numpy(np.array(split.features, dtype=np.float32))
    tokens, lengths = model.tokenize([query])
    with torch.no_grad():
        want = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))[:, 0]
    top = torch.topk(want, 5)
    assert [r.score for r in res] == pytest.approx(top.values.tolist(), abs=1e-4)
    with torch.no_grad():  # the adapters matter: without them the same query scores otherwise
        for lay in model.pretrained_text.hf.lora.layers.values():
            lay.B.zero_()
        base = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))[:, 0]
    assert (base - want).abs().max() > 1e-2
