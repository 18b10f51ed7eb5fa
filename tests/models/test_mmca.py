"""MMCA: exact against the paper's equations one pair at a time, masks, cache, checkpoints, attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch import create_model, load_model
from vlmatch.data.synth import CATEGORIES, COLOURS, POSITIONS, SIZES, TEMPLATES
from vlmatch.encoders import text_cache
from vlmatch.errors import DataError
from vlmatch.models.losses import hinge_triplet

from .reference import mmca_pair, mmca_word_region_attention

CAPTIONS = ["a red dog", "the big blue car on the left", "a cat", "two small birds near a green tree",
            "a dog and a cat"]


def toy_words() -> tuple[str, ...]:
    words = {w for group in CATEGORIES + COLOURS + SIZES + POSITIONS for phrase in group for w in phrase.split()}
    words |= {w for ts in TEMPLATES.values() for t in ts for w in t.split() if not w.startswith("{")}
    return tuple(sorted(words | {"a", "an", "the", "one", "two", "near", "birds"}))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    return str(tiny_bert_folder(tmp_path_factory.mktemp("tinybert"), hidden=24, layers=2, heads=2, words=toy_words()))


def _model(tiny_bert, **kw):
    torch.manual_seed(0)
    opts = dict(img_dim=10, embed_dim=8, heads=2, cnn_filters=6, text_encoder=tiny_bert, text_cache=False)
    return create_model("mmca", **{**opts, **kw})


def _inputs(model, seed):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, 5, 10, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    tokens, lengths = model.tokenize(CAPTIONS)
    return feats, mask, tokens, lengths


@pytest.mark.parametrize("alpha", [0.2, 0.0, 1.0])
def test_mmca_score_equals_loop_reference(tiny_bert, alpha):
    model = _model(tiny_bert, alpha=alpha).double().eval()
    feats, mask, tokens, lengths = _inputs(model, 1)
    with torch.no_grad():
        got = model.score(model.encode_images(feats, mask), model.encode_texts(tokens, lengths))
        e = model.token_vectors(tokens, lengths)
        want = torch.tensor([[mmca_pair(model, feats[i], mask[i], e[j, : lengths[j]]) for j in range(len(CAPTIONS))]
                             for i in range(len(feats))], dtype=torch.float64)
    assert lengths.unique().numel() > 2  # padded captions of several lengths take part
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    if alpha:  # the cross term is really there
        with torch.no_grad():
            s0 = model.encode_images(feats, mask).embedding @ model.encode_texts(tokens, lengths).embedding.T
        assert (got - s0).abs().max() > 1e-3


def test_blocks_padding_and_absent_regions_are_consistent(tiny_bert):
    model = _model(tiny_bert).double().eval()
    feats, mask, tokens, lengths = _inputs(model, 2)
    with torch.no_grad():
        img = model.encode_images(feats, mask)
        full = model.score(img, model.encode_texts(torch.nn.functional.pad(tokens, (0, 4)), lengths))
        part = model.score(img.select(slice(1, 3)), model.encode_texts(tokens[2:4], lengths[2:4]))
        # what hides behind a mask does not matter
        junk = feats.clone()
        junk[~mask] = 1e3
        masked = model.score(model.encode_images(junk, mask), model.encode_texts(tokens, lengths))
    torch.testing.assert_close(part, full[1:3, 2:4])
    torch.testing.assert_close(masked, full)


def test_gradients_reach_every_parameter(tiny_bert):
    model = _model(tiny_bert)
    feats, mask, tokens, lengths = _inputs(model, 3)
    hinge_triplet(model(feats.float(), mask, tokens[:3], lengths[:3])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    assert not any(n.startswith("text.") for n, _ in model.named_parameters())  # frozen encoder: not trained
    tuned = _model(tiny_bert, finetune=True)
    hinge_triplet(tuned(feats.float(), mask, tokens[:3], lengths[:3])).backward()
    grads = {n: p.grad for n, p in tuned.named_parameters() if n.startswith("text.") and ".pooler." not in n}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())  # (BERT's pooler is unused)


def test_frozen_outputs_are_cached_on_disk_by_encoder_and_caption(tiny_bert, monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    monkeypatch.setattr(text_cache, "_OPEN", {})
    model = _model(tiny_bert, text_cache=True).eval()
    calls = []
    real = model.text.forward
    monkeypatch.setattr(model.text, "forward", lambda t, n: calls.append(len(n)) or real(t, n))
    tokens, lengths = model.tokenize(CAPTIONS)
    first = model.token_vectors(tokens, lengths)
    again = model.token_vectors(tokens[[4, 0]], lengths[[4, 0]])
    assert calls == [5]  # the second call was all hits
    torch.testing.assert_close(again[1, : lengths[0]], first[0, : lengths[0]])
    assert again[0, lengths[4]:].eq(0).all() and first[0, lengths[0]:].eq(0).all()
    torch.testing.assert_close(first, real(tokens, lengths))
    model.text.output_cache().flush()
    shards = list((tmp_path / "text-encoder").glob("*/shard-*.safetensors"))
    assert len(shards) == 1
    monkeypatch.setattr(text_cache, "_OPEN", {})  # a new process: reads the shard, encodes nothing
    fresh = _model(tiny_bert, text_cache=True).eval()
    monkeypatch.setattr(fresh.text, "forward", lambda t, n: calls.append(len(n)) or real(t, n))
    torch.testing.assert_close(fresh.token_vectors(tokens, lengths), first)
    assert calls == [5]
    other = tiny_bert_folder(tmp_path / "other", hidden=24, layers=2, heads=2, words=toy_words(), seed=3)
    assert _model(str(other), text_cache=True).token_vectors(tokens, lengths).sub(first).abs().max() > 1e-3


def test_checkpoint_keeps_tokenizer_and_checks_the_encoder(tiny_bert, tmp_path):
    model = _model(tiny_bert).eval()
    feats, mask, tokens, lengths = _inputs(model, 4)
    model.save(tmp_path / "ck")
    assert (tmp_path / "ck" / "tokenizer" / "vocab.txt").is_file()
    assert not any(k.startswith("text.") for k in model.state_dict())  # frozen BERT weights stay in their folder
    again = load_model(tmp_path / "ck")
    t2, l2 = again.tokenize(CAPTIONS)
    assert torch.equal(t2, tokens) and again.decode_tokens(t2[0], int(l2[0])) == ["[CLS]", "a", "red", "dog", "[SEP]"]
    with torch.no_grad():
        torch.testing.assert_close(again.score(again.encode_images(feats.float(), mask), again.encode_texts(t2, l2)),
                                   model.score(model.encode_images(feats.float(), mask), model.encode_texts(tokens, lengths)))
    info = (tmp_path / "ck" / "text_encoder.json")
    info.write_text(info.read_text().replace('"sha256": "', '"sha256": "0'))
    with pytest.raises(DataError, match="text_encoder.json: the checkpoint was trained with text encoder"):
        load_model(tmp_path / "ck")


def test_pair_attention_and_global_embeddings(tiny_bert):
    model = _model(tiny_bert).eval()
    feats, mask, tokens, lengths = _inputs(model, 5)
    img = model.encode_images(feats.float(), mask)
    txt = model.encode_texts(tokens, lengths)
    att = model.pair_attention(img.select([1]), txt.select([1]))
    assert att["axis"] == "regions" and att["weights"].shape == (5, int(lengths[1]))
    np.testing.assert_allclose(att["weights"].sum(axis=0), 1.0, rtol=1e-5)
    assert np.all(att["weights"][~mask[1].numpy()] == 0)  # absent regions get no weight
    n = int(lengths[1])
    want = mmca_word_region_attention(model, feats[1].float(), mask[1], model.token_vectors(tokens, lengths)[1, :n])
    np.testing.assert_allclose(att["weights"], np.array(want), rtol=1e-4, atol=1e-6)
    a, b = model.global_embeddings(img, txt)
    ablation = _model(model.cfg.text_encoder, alpha=0.0).eval()
    ablation.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ablation.score(img, txt), a @ b.T)


def test_position_attention_is_each_pairs_word_to_region_attention_against_the_loop_reference(tiny_bert):
    """The batched diagonal maps the grounding objective trains: each word's cross-unit weights over the regions,
    heads averaged and renormalised, computed one pair, head and token at a time; equal to ``pair_attention``."""
    model = _model(tiny_bert).double().eval()
    feats, mask, tokens, lengths = _inputs(model, 2)
    tokens, lengths = tokens[:3], lengths[:3]
    got = model.position_attention(feats, mask, tokens, lengths)
    assert got.shape == (3, 5, tokens.shape[1])
    e = model.token_vectors(tokens, lengths).detach()
    with torch.no_grad():
        img, txt = model.encode_images(feats, mask), model.encode_texts(tokens, lengths)
    for b in range(3):
        n = int(lengths[b])
        want = torch.tensor(mmca_word_region_attention(model, feats[b], mask[b], e[b, :n]), dtype=torch.float64)
        torch.testing.assert_close(got[b, :, :n].detach(), want, atol=1e-9, rtol=0)
        assert (got[b, :, n:] == 0).all() and (got[b][~mask[b]] == 0).all()
        shown = model.pair_attention(img.select([b]), txt.select([b]))["weights"]
        np.testing.assert_allclose(got[b, :, :n].detach().numpy(), shown, atol=1e-6)
    got[:, 0, 1].sum().backward()
    assert model.img_fc.weight.grad.abs().sum() > 0 and model.cross_unit.wq.weight.grad.abs().sum() > 0
