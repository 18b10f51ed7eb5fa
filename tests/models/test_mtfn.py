import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.loaders import CaptionPairDataset
from vlmatch.data.precomp import PrecompSplit
from vlmatch.errors import ConfigError
from vlmatch.models.losses import caption_pair_triplet

from ..conftest import write_precomp
from .reference import mtfn_caption_scores, mtfn_scores
from .test_scan import VOCAB, _inputs


def _model(**kw):
    torch.manual_seed(0)
    m = create_model("mtfn", img_dim=12, embed_dim=8, word_dim=7, vocab_size=VOCAB, rank=3, fusion_dim=5, **kw).double()
    with torch.no_grad():  # a non-zero c and text-text weights unlike the image-text ones
        m.it.out.bias.fill_(0.3)
        for p in [*m.tt.parameters(), *m.tt_proj.parameters()]:
            p.add_(0.5 * torch.randn_like(p))
    return m.eval()


@pytest.mark.parametrize("input_norm", ["l2", "none"])
@pytest.mark.parametrize("grad", [True, False], ids=["rank-form", "folded-G"])
def test_mtfn_score_equals_plain_equations(grad, input_norm):
    model = _model(input_norm=input_norm)
    feats, mask, tokens, lengths = _inputs(seed=3)
    feats = feats.double()
    with torch.set_grad_enabled(grad):
        got = model.score(model.encode_images(feats, mask), model.encode_texts(tokens, lengths))
    want = mtfn_scores(model, feats, mask, tokens, lengths)
    torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)


def test_mtfn_one_gemm_vectors_are_exact():
    model = _model()
    feats, mask, tokens, lengths = _inputs(seed=4)
    with torch.no_grad():
        img, txt = model.encode_images(feats.double(), mask), model.encode_texts(tokens, lengths)
        want = mtfn_scores(model, feats.double(), mask, tokens, lengths)
        a, b = model.global_embeddings(img, txt)
        assert a.shape[1] == b.shape[1] == model.cfg.embed_dim + 1
        torch.testing.assert_close(torch.sigmoid(a @ b.T), want, atol=1e-5, rtol=0)
        ra, rb = model.rank_vectors(img, txt)
        assert ra.shape[1] == model.cfg.rank * model.cfg.fusion_dim + 1
        torch.testing.assert_close(torch.sigmoid(ra @ rb.T), want, atol=1e-5, rtol=0)
        # the sigmoid is monotone: ranking by the inner product is the model's ranking
        assert torch.equal((a @ b.T).argsort(dim=1), want.argsort(dim=1))


@pytest.mark.parametrize("grad", [True, False])
def test_mtfn_text_text_scores_equal_plain_equations(grad):
    model = _model()
    _, _, tokens, lengths = _inputs(seed=5)
    with torch.set_grad_enabled(grad):
        txt = model.encode_texts(tokens, lengths)
        got = model.caption_scores(txt, txt)
    torch.testing.assert_close(got.detach(), mtfn_caption_scores(model, tokens, lengths), atol=1e-5, rtol=0)
    assert not torch.allclose(got.detach(), model.score(model.encode_images(torch.randn(4, 5, 12).double()), txt)[:4])


def test_input_norm_none_feeds_the_raw_vectors():
    """input_norm=none (the paper): scaling the image features scales ṽ - W_v's bias; l2 ignores the scale."""
    feats, mask, tokens, lengths = _inputs(seed=6)
    feats = feats.double()
    for norm, same in (("l2", True), ("none", False)):
        m = _model(input_norm=norm)
        with torch.no_grad():
            a, b = m.encode_images(feats, mask).embedding, m.encode_images(3 * feats, mask).embedding
        assert torch.allclose(a, b) is same
        assert m.text_features(tokens, lengths).norm(dim=1).sub(1).abs().max().item() < 1e-6 if norm == "l2" \
            else m.text_features(tokens, lengths).norm(dim=1).sub(1).abs().max().item() > 1e-3
    with pytest.raises(ConfigError, match="input_norm"):
        _model(input_norm="batchnorm")


def test_folded_matrix_follows_weight_updates():
    model = _model()
    _, _, tokens, lengths = _inputs(seed=6)
    feats = torch.randn(2, 5, 12).double()
    with torch.no_grad():
        before = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))
        model.it.a.weight.mul_(2.0)  # in-place, as an optimiser step does
        after = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))
    with torch.enable_grad():
        want = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths)).detach()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want)


def test_folded_matrix_follows_the_training_loops_optimizer_between_validations():
    """The trainer's Adam (torch's fused kernel) updates the weights without moving their version counters;
    the eval() that starts every evaluation drops the cached G, so validation scores the updated weights."""
    from vlmatch.training.loop import make_optimizer

    model = _model().float()
    _, _, tokens, lengths = _inputs(seed=6)
    feats = torch.randn(2, 5, 12)
    with torch.no_grad():
        before = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))
    model.train()
    opt = make_optimizer(list(model.it.parameters()), {"optimizer": "adam", "lr": 0.1, "lr_update": 10,
                                                       "weight_decay": 0.0})
    for p in model.it.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    model.eval()
    with torch.no_grad():
        after = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))
    with torch.enable_grad():
        want = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths)).detach()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want)


def test_text_text_stage_starts_from_image_text_branch_and_freezes_it():
    model = _model().float()
    assert model.begin_stage(None) == "image_caption"
    assert model.begin_stage("text_text") == "caption_pair"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if n.startswith(("tt.", "tt_proj."))}
    torch.testing.assert_close(model.tt_proj.weight, model.txt_proj.weight)
    torch.testing.assert_close(model.tt.a.weight, model.it.b.weight)
    torch.testing.assert_close(model.tt.out.weight, model.it.out.weight)
    _, _, tokens, lengths = _inputs(seed=7)
    scores = model(tokens, lengths, tokens.flip(0), lengths.flip(0))
    assert scores.shape == (4, 8)
    caption_pair_triplet(scores, torch.arange(4)).backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trainable)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    with pytest.raises(ConfigError):
        model.begin_stage("nonsense")


def test_caption_pair_triplet_is_eq7_with_the_hardest_other_caption():
    s = torch.tensor([[0.9, 0.2, 0.5, 0.0],  # anchor 0: partner 0.9; other captions: 0.2 (partner 1), 0.0 (anchor 1)
                      [0.8, 0.4, 0.0, 0.1]])  # anchor 1: partner 0.4; negatives 0.8 (partner 0), 0.0 (anchor 0)
    ids = torch.tensor([0, 1])
    # anchor 0: [0.2 - 0.9 + 0.2]+ = 0; anchor 1: hardest 0.8 -> 0.2 - 0.4 + 0.8 = 0.6
    assert caption_pair_triplet(s, ids, 0.2, True).item() == pytest.approx(0.6)
    assert caption_pair_triplet(s, ids, 0.2, False).item() == pytest.approx(0.6)
    # two pairs of the same image: nothing in the batch is a negative
    assert caption_pair_triplet(s, torch.tensor([3, 3]), 0.2, True).item() == 0.0


def test_caption_pair_sampler_pairs_two_captions_of_one_image(tmp_path):
    caps = [f"image {i} caption {c}" for i in range(4) for c in range(5)]
    root = write_precomp(tmp_path / "d", "train", np.zeros((4, 2, 3)), caps)
    model = create_model("mtfn", img_dim=3, embed_dim=8, vocab_size=VOCAB)
    model.tokenize = lambda cs: (torch.ones(len(cs), 1, dtype=torch.long), torch.ones(len(cs), dtype=torch.long))
    ds = CaptionPairDataset(PrecompSplit(root, "train"), model)
    seen = set()
    for epoch in range(3):
        ds.set_epoch(0, epoch)
        for j in range(len(ds)):
            _, _, a, q, img = ds[j]
            assert a == j and q != j and q // 5 == j // 5 == img
            seen.add((j, q))
        first = [ds[j][3] for j in range(len(ds))]
        ds.set_epoch(0, epoch)
        assert first == [ds[j][3] for j in range(len(ds))]  # a pure function of (seed, epoch)
    assert len(seen) > len(ds)  # partners change across epochs


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from tests.encoders.tiny_bert import tiny_bert_folder

    return tiny_bert_folder(tmp_path_factory.mktemp("tinybert"), words=("a", "dog", "red", "ball", "runs"))


@pytest.mark.parametrize("input_norm", ["none", "l2"])
def test_mtfn_sentence_encoder_scores_equal_plain_equations_and_reload(tiny_bert, tmp_path, input_norm):
    from vlmatch import load_model
    from vlmatch.models.registry import model_class

    assert model_class("mtfn_sentence").uses_vocab is False
    torch.manual_seed(0)
    model = create_model("mtfn_sentence", img_dim=12, embed_dim=8, rank=3, fusion_dim=5, text_model=str(tiny_bert),
                         input_norm=input_norm)
    model = model.double().eval()
    assert all(not n.startswith("sentence.") for n, _ in model.named_parameters())  # frozen, not trained or saved
    tokens, lengths = model.tokenize(["a red dog runs", "a ball", "dog"])
    feats = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        got = model.score(model.encode_images(feats), model.encode_texts(tokens, lengths))
        words = model.sentence(tokens, lengths)
        t = words[1, : int(lengths[1])].mean(0)  # mean pooling of caption 1's token vectors
        torch.testing.assert_close(model.text_features(tokens, lengths)[1], t / (t.norm() + 1e-8) if input_norm == "l2" else t)
    torch.testing.assert_close(got, mtfn_scores(model, feats, None, tokens, lengths), atol=1e-5, rtol=0)
    model.save(tmp_path / "m")
    again = load_model(tmp_path / "m").double()
    with torch.no_grad():
        torch.testing.assert_close(again.score(again.encode_images(feats), again.encode_texts(tokens, lengths)), got)


def test_batch_score_flops_counts_what_a_training_score_multiplies():
    from torch.utils.flop_counter import FlopCounterMode

    model = _model()
    feats, mask, tokens, lengths = _inputs(seed=5)
    n = min(len(feats), len(tokens))  # a training batch: as many images as captions
    img = model.encode_images(feats[:n].double(), None if mask is None else mask[:n])
    txt = model.encode_texts(tokens[:n], lengths[:n])
    with torch.enable_grad(), FlopCounterMode(display=False) as fc:
        model.score(img, txt)
    want = model.batch_score_flops(len(img.embedding), feats.shape[1], int(lengths.max()))
    assert fc.get_total_flops() // 2 == want["macs"]
    assert want["macs"] > len(img.embedding) ** 2 * model.pair_flops(feats.shape[1], 4)["macs"]  # not the folded count
