"""LoRA adapters on the frozen text transformer (vlmatch.encoders.lora): the adapted forward is the paper's
equation, merging gives the same outputs, a checkpoint holds only the adapters and refuses another base, the
adapters train at train.pretrained_lr_scale, and queries of an adapted model never share outputs with the
frozen base's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch import create_model, load_model
from vlmatch.encoders.hf import HFTextEncoder, for_queries
from vlmatch.encoders.lora import LoRASpec, parse_lora, target_layers
from vlmatch.errors import ConfigError, DataError
from vlmatch.training.loop import param_groups

CAPTIONS = ["a red dog runs", "a dog", "the red ball runs after a dog"]
WORDS = ("a", "the", "dog", "red", "ball", "runs", "after")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_bert_folder(tmp_path_factory.mktemp("lora_bert"), hidden=16, layers=2, heads=2, words=WORDS)


def _randomise(enc: HFTextEncoder, seed: int = 1) -> None:
    """Non-zero B (a freshly built adapter is the identity: B = 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.lora.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def test_a_fresh_adapter_is_the_base_model_and_the_adapted_forward_is_the_equation(bert):
    base = HFTextEncoder(bert).double()
    enc = HFTextEncoder(bert, lora=LoRASpec(rank=3, targets=("query", "value"), alpha=6.0)).double()
    tokens, lengths = enc.tokenize(CAPTIONS)
    torch.testing.assert_close(enc(tokens, lengths), base(tokens, lengths))  # B = 0
    _randomise(enc)
    adapted = enc(tokens, lengths)
    assert (adapted - base(tokens, lengths)).abs().max() > 1e-3
    # the same forward written out: a copy of the base whose adapted layers are x W^T + b + 2 (x A^T) B^T
    plain = HFTextEncoder(bert).double()
    layers = target_layers(plain.model, ("query", "value"))
    assert len(layers) == 4  # 2 layers x (query, value)
    for name, lin in layers.items():
        lay = enc.lora.layers[name.replace(".", "__")]

        def forward(x, lin=lin, lay=lay):
            out = x @ lin.weight.T + lin.bias
            for i in range(lay.A.shape[0]):  # rank-one terms, one by one
                out = out + 2.0 * (x @ lay.A[i])[..., None] * lay.B[:, i]
            return out
        lin.forward = forward
    torch.testing.assert_close(adapted, plain(tokens, lengths))


def test_merged_weights_equal_the_adapted_forward(bert):
    enc = HFTextEncoder(bert, lora=LoRASpec(rank=4, targets=("query", "key", "value", "dense"), alpha=8.0)).double()
    _randomise(enc, seed=2)
    tokens, lengths = enc.tokenize(CAPTIONS)
    before = enc(tokens, lengths)
    enc.eval().merge_adapters()
    assert enc.lora.merged and not enc.adapted
    torch.testing.assert_close(enc(tokens, lengths), before)  # the base weights now hold W + scale B A
    enc.merge_adapters()  # a second merge changes nothing
    torch.testing.assert_close(enc(tokens, lengths), before)
    enc.train()
    with pytest.raises(RuntimeError, match="merged"):
        enc(tokens, lengths)


def test_adapters_are_the_only_trained_transformer_weights_and_take_the_pretrained_lr(bert):
    m = create_model("vsepp", img_dim=6, embed_dim=8, text_encoder=str(bert), text_lora={"rank": 2})
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    assert not any(".hf.transformer." in n for n in names)
    lora = [n for n in names if ".lora." in n]
    assert len(lora) == 2 * 2 * 2  # 2 layers x (query, value) x (A, B)
    groups = param_groups(m, {"pretrained_lr_scale": 0.1})
    assert [g["lr_scale"] for g in groups] == [1.0, 0.1]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for n, p in m.named_parameters() if ".lora." in n}
    m.train()
    tokens, lengths = m.tokenize(CAPTIONS)
    m.encode_texts(tokens, lengths).embedding.sum().backward()
    b = dict(m.named_parameters())[lora[1]]
    assert b.grad is not None and b.grad.abs().sum() > 0  # the adapters learn through the frozen transformer


def _scores(m, tokens, lengths):
    feats = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return m.score(m.encode_images(feats), m.encode_texts(tokens, lengths))


def test_checkpoint_holds_only_the_adapters_and_refuses_another_base(bert, tmp_path):
    folder = shutil.copytree(bert, tmp_path / "base")
    torch.manual_seed(0)
    m = create_model("scan_t2i_avg", img_dim=6, embed_dim=8, text_encoder=str(folder), text_cache=False,
                     text_lora={"rank": 2, "targets": ["query", "value"], "alpha": 4}).eval()
    _randomise(m.pretrained_text.hf)
    tokens, lengths = m.tokenize(CAPTIONS)
    want = _scores(m, tokens, lengths)
    m.save(tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(".lora." in k for k in keys) and not any(".transformer." in k or "embeddings" in k for k in keys)
    record = json.loads((tmp_path / "ckpt" / "text_encoder.json").read_text())
    assert record["lora"] == {"rank": 2, "targets": ["query", "value"], "alpha": 4.0} and not record["finetuned"]
    again = load_model(tmp_path / "ckpt").eval()
    torch.testing.assert_close(_scores(again, tokens, lengths), want)
    # another base in the same folder: its weights differ, so the adapters are refused
    tiny_bert_folder(folder, hidden=16, layers=2, heads=2, words=WORDS, seed=5)
    with pytest.raises(DataError, match="LoRA adapters belong to base text encoder"):
        load_model(tmp_path / "ckpt")


def test_queries_of_an_adapted_model_do_not_share_outputs_with_its_frozen_base(bert):
    frozen = create_model("vsepp", img_dim=6, embed_dim=8, text_encoder=str(bert), text_cache=False).eval()
    adapted = create_model("vsepp", img_dim=6, embed_dim=8, text_encoder=str(bert), text_cache=False,
                           text_lora={"rank": 2}).eval()
    _randomise(adapted.pretrained_text.hf, seed=3)
    tokens, lengths = adapted.tokenize(CAPTIONS)
    with torch.no_grad():
        want_frozen = frozen.pretrained_text.hf(tokens, lengths)
        want_adapted = adapted.pretrained_text.hf(tokens, lengths)
    for_queries(frozen, adapted)  # both through the shared in-memory memo, adapters merged
    assert adapted.pretrained_text.hf.lora.merged
    with torch.no_grad():
        got_frozen = frozen.pretrained_text.hf.token_vectors(tokens, lengths)
        got_adapted = adapted.pretrained_text.hf.token_vectors(tokens, lengths)
        got_frozen_again = frozen.pretrained_text.hf.token_vectors(tokens, lengths)
    torch.testing.assert_close(got_adapted, want_adapted, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_frozen, want_frozen, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_frozen_again, want_frozen, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("value, problem", [
    ({"rank": 0}, "rank must be an integer from 1"),
    ({"rank": "8"}, "rank must be an integer"),
    ({"rank": 4, "alpha": -1}, "alpha must be a positive number"),
    ({"rank": 4, "targets": []}, "targets must be a non-empty list"),
    ({"rank": 4, "dropout": 0.1}, "unknown key"),
    (8, "must be a mapping"),
])
def test_bad_lora_options_are_one_line_each(value, problem):
    with pytest.raises(ValueError, match=problem):
        parse_lora(value)


def test_lora_option_is_checked_with_the_model(bert):
    assert parse_lora({"rank": 4}) == LoRASpec(rank=4, targets=("query", "value"), alpha=8.0)
    with pytest.raises(ConfigError, match="text_lora"):
        create_model("vsepp", img_dim=6, embed_dim=8, text_lora={"rank": 4})  # the GRU has nothing to adapt
    with pytest.raises(ConfigError, match="finetune"):
        create_model("vsepp", img_dim=6, embed_dim=8, text_encoder=str(bert), finetune=True, text_lora={"rank": 4})
    with pytest.raises(ConfigError, match="match no linear layer"):
        create_model("vsepp", img_dim=6, embed_dim=8, text_encoder=str(bert), text_lora={"targets": ["qkv"]})


def test_the_dense_target_leaves_the_pooler_out_unless_named(bert):
    from transformers import AutoModel

    base = AutoModel.from_pretrained(str(bert))
    assert any(n == "pooler.dense" for n, _ in base.named_modules())  # the tiny BERT has one
    dense = target_layers(base, ("query", "key", "value", "dense"))
    assert dense and "pooler.dense" not in dense and all(n.startswith("encoder.") for n in dense)
    assert "pooler.dense" in target_layers(base, ("pooler.dense",))
    enc = HFTextEncoder(bert, lora=LoRASpec(rank=2, targets=("dense",), alpha=4.0))
    assert not any("pooler" in n for n, _ in enc.lora.named_parameters())


def _with_pooler_adapter(ckpt, b_value: float):
    """The checkpoint as an older vlmatch saved it: a pooler.dense adapter beside the others (B = b_value)."""
    import hashlib

    from safetensors.torch import load_file, save

    from vlmatch.checkpoints.seal import seal_checkpoint

    path = ckpt / "model.safetensors"
    state = load_file(str(path))
    prefix = next(k for k in state if ".lora.layers." in k).split(".lora.layers.")[0]
    state[f"{prefix}.lora.layers.pooler__dense.A"] = torch.randn(2, 16)
    state[f"{prefix}.lora.layers.pooler__dense.B"] = torch.full((16, 2), b_value)
    data = save(state)
    path.write_bytes(data)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "weights_sha256": hashlib.sha256(data).hexdigest()}))
    seal_checkpoint(ckpt)


def test_an_older_checkpoint_with_an_all_zero_pooler_adapter_loads_the_same(bert, tmp_path):
    torch.manual_seed(0)
    m = create_model("scan_t2i_avg", img_dim=6, embed_dim=8, text_encoder=str(bert), text_cache=False,
                     text_lora={"rank": 2, "targets": ["query", "value", "dense"], "alpha": 4}).eval()
    _randomise(m.pretrained_text.hf)
    tokens, lengths = m.tokenize(CAPTIONS)
    want = _scores(m, tokens, lengths)
    m.save(tmp_path / "ck")
    _with_pooler_adapter(tmp_path / "ck", 0.0)
    again = load_model(tmp_path / "ck").eval()
    torch.testing.assert_close(_scores(again, tokens, lengths), want)
    _with_pooler_adapter(tmp_path / "ck", 0.5)  # a pooler adapter that did something: not silently dropped
    with pytest.raises(DataError, match=r"pooler__dense.B is not zero, so the pooler adapter did change the model"):
        load_model(tmp_path / "ck")


def test_the_shipped_lora_models_hold_a_zero_pooler_adapter_or_none_and_load_without_it():
    """The 448 px model was trained before the dense target left the pooler out: its pooler adapter is all zero
    and dropped at load; the default was trained after, and holds none."""
    from vlmatch import pretrained

    for name, old in (("vsepp-lite2-448-lora-f8k", True), ("vsepp-lite2-320-grounded-f8k", False)):
        folder = pretrained.get(name).folder
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            pooler = [k for k in f.keys() if "pooler" in k]  # noqa: SIM118
            assert bool(pooler) == old
            assert not pooler or not f.get_tensor(next(k for k in pooler if k.endswith(".B"))).any()
            assert any("lora" in k.lower() or k.endswith(".A") for k in f.keys())  # noqa: SIM118
        model = load_model(f"pretrained:{name}")
        assert not any("pooler" in n for n, _ in model.named_parameters())
