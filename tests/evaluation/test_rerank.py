import numpy as np
import pytest

from vlmatch.errors import DataError, VlmatchError
from vlmatch.evaluation.metrics import evaluate_protocol
from vlmatch.evaluation.rerank import (
    evaluate_reranked,
    fold_captions,
    neighbors_from_vectors,
    rerank,
    stable_topk,
    text_neighbors,
)

from .rerank_reference import loop_i2t, loop_t2i, ranking


def _matrices(seed, n_img=6, per=3, levels=4):
    rng = np.random.default_rng(seed)
    S = rng.integers(0, levels, size=(n_img, n_img * per)).astype(np.float32)  # many ties
    STT = rng.integers(0, levels, size=(n_img * per, n_img * per)).astype(np.float32)
    return S, STT


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("K,Kp", [(1, 0), (3, 2), (5, 1), (30, 4)])
def test_vectorised_rerank_equals_loop_over_equations(seed, K, Kp):
    S, STT = _matrices(seed)
    i2t, t2i = rerank(S, K, Kp, text_sims=STT if Kp else None)
    want_i2t = loop_i2t(S, K)
    want_t2i = loop_t2i(S, K, STT if Kp else None, Kp)
    assert [ranking(row) for row in i2t] == want_i2t
    assert [ranking(t2i[:, t]) for t in range(S.shape[1])] == want_t2i


def test_candidates_with_equal_p_and_score_stay_tied_for_the_metric():
    # image 0: captions 0 and 1 tie in score and in p: the metric must still count the tie against the gt
    S = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]], dtype=np.float32)
    S[1, 1] = 0.0
    i2t, _ = rerank(S, 2, 0)
    assert i2t[0, 0] == i2t[0, 1] and i2t[0, 0] > S[0].max()


def test_rerank_keeps_order_beyond_k_and_float_dtype():
    S, _ = _matrices(3, n_img=8, per=5, levels=50)
    i2t, t2i = rerank(S, 2, 0)
    assert i2t.dtype == np.float32
    for i in range(len(S)):
        assert ranking(i2t[i])[2:] == ranking(S[i])[2:]


def test_stable_topk_breaks_ties_by_index():
    x = np.array([[1, 3, 3, 2, 3], [0, 0, 0, 0, 0]], dtype=np.float64)
    assert stable_topk(x, 2).tolist() == [[1, 2], [0, 1]]
    assert stable_topk(x, 5).tolist() == [[1, 2, 4, 3, 0], [0, 1, 2, 3, 4]]


def test_text_neighbours_exclude_self_and_match_vectors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((20, 4)).astype(np.float32)
    nb = neighbors_from_vectors(a, a, 3, chunk=7)
    full = text_neighbors(a @ a.T, 3)
    assert (nb == full).all() and not (nb == np.arange(20)[:, None]).any()


def test_rr_helps_when_the_other_direction_knows_better():
    # I2T of image 0 ranks a wrong caption first, but that caption's own ranking prefers image 1
    S = np.array([[0.9, 0.5, 0.1, 0.95],
                  [0.2, 0.1, 0.8, 0.99]], dtype=np.float32)  # 2 images, 2 captions each
    res = evaluate_reranked(S, "single", k=2, k_text=0)
    assert res["before"]["i2t_r1"] == 50.0 and res["after"]["i2t_r1"] == 100.0
    assert res["text"] == "none"


def test_evaluate_reranked_5fold_reranks_within_folds():
    rng = np.random.default_rng(1)
    S = rng.standard_normal((10, 50)).astype(np.float32)
    res = evaluate_reranked(S, "coco1k5fold", k=3, k_text=0, fold_images=2)
    by_fold = [evaluate_reranked(S[2 * f:2 * f + 2, 10 * f:10 * f + 10], "single", k=3, k_text=0)["after"]
               for f in range(5)]
    assert res["after"]["rsum"] == pytest.approx(np.mean([f["rsum"] for f in by_fold]))
    assert res["before"]["rsum"] == pytest.approx(evaluate_protocol(S, "coco1k5fold", fold_images=2)["rsum"])


def test_rerank_cli_json_has_both_directions_before_and_after(tmp_path, capsys):
    from vlmatch.cli import main

    rng = np.random.default_rng(2)
    S = rng.standard_normal((20, 100)).astype(np.float32)
    S[np.arange(100) // 5, np.arange(100)] += 1.0
    TT = rng.standard_normal((100, 100)).astype(np.float32)
    np.save(tmp_path / "s.npy", S)
    np.save(tmp_path / "tt.npy", TT)
    assert main(["rerank", "--sims", str(tmp_path / "s.npy"), "--k", "4", "--k-text", "2", "--text-sims",
                 str(tmp_path / "tt.npy"), "--protocol", "single", "--json", str(tmp_path / "r.json")]) == 0
    import json

    r = json.loads((tmp_path / "r.json").read_text())
    want = evaluate_reranked(S, "single", k=4, k_text=2, text_sims=TT)
    for side in ("before", "after"):
        for key in ("rsum", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r10", "t2i_medr"):
            assert r[side][key] == pytest.approx(want[side][key])
    assert r["k"] == 4 and r["k_text"] == 2 and r["text"] == "S_TT"
    assert "RR K=4, K'=2" in capsys.readouterr().out
    # the evaluate command's re-ranking option gives the same figures
    assert main(["evaluate", "--sims", str(tmp_path / "s.npy"), "--rerank", "--k", "4", "--k-text", "2",
                 "--text-sims", str(tmp_path / "tt.npy"), "--json", str(tmp_path / "e.json")]) == 0
    e = json.loads((tmp_path / "e.json").read_text())
    assert e["rerank"]["after"]["rsum"] == pytest.approx(r["after"]["rsum"])


def test_rerank_cli_bad_input_is_one_line(tmp_path, capsys):
    from vlmatch.cli import main

    np.save(tmp_path / "s.npy", np.zeros((2, 10), dtype=np.float32))
    np.save(tmp_path / "tt.npy", np.zeros((3, 3), dtype=np.float32))
    assert main(["rerank", "--sims", str(tmp_path / "s.npy"), "--text-sims", str(tmp_path / "tt.npy")]) == 2
    err = capsys.readouterr().err
    assert "tt.npy" in err and "(10, 10)" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["rerank", "--sims", str(tmp_path / "missing.npy")]) == 2
    assert "missing.npy" in capsys.readouterr().err


@pytest.mark.slow  # the sentence encoder
def test_sentence_encoder_neighbours_are_cosine_neighbours(tmp_path):
    import torch

    from tests.encoders.tiny_bert import tiny_bert_folder
    from vlmatch.encoders.hf import HFTextEncoder
    from vlmatch.evaluation.rerank import sentence_neighbors

    folder = tiny_bert_folder(tmp_path / "bert", words=("a", "dog", "red", "ball", "runs", "cat"))
    caps = ["a dog runs", "a red dog runs", "a ball", "a red ball", "a cat", "a cat runs"]
    nb = sentence_neighbors(folder, caps, 2)
    enc = HFTextEncoder(folder)
    with torch.no_grad():
        rows = []
        for c in caps:
            tok, n = enc.tokenize([c])
            v = enc(tok, n)[0].mean(0)
            rows.append((v / v.norm()).numpy())
    V = np.stack(rows)
    assert (nb == text_neighbors(V @ V.T, 2)).all()


@pytest.mark.parametrize("group,k_text", [(5, 2), (5, 4), (5, 9), (20, 3), (1, 3)])
def test_neighbours_within_groups_are_each_groups_own(group, k_text):
    rng = np.random.default_rng(3)
    a = np.round(rng.standard_normal((20, 3)), 1).astype(np.float32)  # ties too
    nb = neighbors_from_vectors(a, a, k_text, chunk=3, group=group)
    assert nb.shape == (20, min(k_text, group - 1))
    for g in range(0, 20, group):
        block = a[g:g + group] @ a[g:g + group].T
        assert (nb[g:g + group] == text_neighbors(block, k_text) + g).all()
    assert (text_neighbors(a @ a.T, k_text, chunk=7, group=group) == nb).all()
    with pytest.raises(VlmatchError, match="groups of 7"):
        neighbors_from_vectors(a, a, 2, group=7)


def test_5fold_rerank_with_s_tt_is_each_folds_own_rerank():
    """COCO 1K with S_TT: each fold is re-ranked alone, with neighbours from that fold's S_TT only; the
    whole matrix and per-fold neighbours give the same, and neighbours across folds are refused."""
    rng = np.random.default_rng(4)
    per, fold = 3, 4  # 5 folds of 4 images, 12 captions each
    S = rng.standard_normal((5 * fold, 5 * fold * per)).astype(np.float32)
    S[np.arange(S.shape[1]) // per, np.arange(S.shape[1])] += 1.0
    TT = rng.standard_normal((S.shape[1], S.shape[1])).astype(np.float32)
    res = evaluate_reranked(S, "coco1k5fold", k=3, k_text=2, text_sims=TT, fold_images=fold)
    assert res["text"] == "S_TT"
    for f in range(5):
        fi, fc = slice(f * fold, (f + 1) * fold), slice(f * fold * per, (f + 1) * fold * per)
        alone = evaluate_reranked(S[fi, fc], "single", k=3, k_text=2, text_sims=TT[fc, fc])["after"]
        assert res["after"]["folds"][f] == pytest.approx({k: v for k, v in alone.items() if k in res["after"]["folds"][f]})
    group = fold_captions("coco1k5fold", S.shape[1], S.shape[0], fold)
    assert group == fold * per and fold_captions("coco5k", S.shape[1], S.shape[0]) is None
    with pytest.raises(VlmatchError, match="needs 20 images .5 folds of 4.; the score matrix has 10"):
        fold_captions("coco1k5fold", 30, 10, fold)
    by_nb = evaluate_reranked(S, "coco1k5fold", k=3, k_text=2, neighbors=text_neighbors(TT, 2, group=group),
                              fold_images=fold)
    assert by_nb["after"] == res["after"]
    with pytest.raises(DataError, match="reach outside their fold"):
        evaluate_reranked(S, "coco1k5fold", k=3, k_text=2, neighbors=text_neighbors(TT, 2), fold_images=fold)
    # without S_TT the 5-fold path is unchanged
    assert evaluate_reranked(S, "coco1k5fold", k=3, k_text=0, text_sims=TT, fold_images=fold)["text"] == "none"


def test_sentence_encoder_neighbours_within_groups(tmp_path):
    from tests.encoders.tiny_bert import tiny_bert_folder
    from vlmatch.evaluation.rerank import sentence_neighbors, sentence_vectors

    folder = tiny_bert_folder(tmp_path / "bert", words=("a", "dog", "red", "ball", "runs", "cat"))
    caps = ["a dog runs", "a red dog runs", "a ball", "a red ball", "a cat", "a cat runs"]
    V = sentence_vectors(folder, caps)
    nb = sentence_neighbors(folder, caps, 2, group=3)
    assert (nb == text_neighbors(V @ V.T, 2, group=3)).all() and (nb[:3] < 3).all() and (nb[3:] >= 3).all()


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory):
    """A toy COCO 1K test set (5 folds of 1000 images, 2 captions each) and an MTFN with an S_TT branch."""
    import torch

    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    from ..conftest import write_precomp

    rng = np.random.default_rng(5)
    n = 5000
    words = [f"w{i}" for i in range(40)]
    caps = [" ".join(rng.choice(words, size=4)) for _ in range(2 * n)]
    root = write_precomp(tmp_path_factory.mktemp("coco1k"), "testall", rng.standard_normal((n, 2, 6)), caps)
    torch.manual_seed(0)
    vocab = Vocab.build(caps, min_count=1)
    model = create_model("mtfn", vocab=vocab, img_dim=6, embed_dim=8, word_dim=4, rank=2, fusion_dim=4)
    with torch.no_grad():  # a text-text branch of its own, as after the text_text stage
        for p in [*model.tt.parameters(), *model.tt_proj.parameters()]:
            p.add_(torch.randn_like(p))
        model.tt_trained.fill_(1)
    model.save(root / "mtfn")
    return root, model.eval()


@pytest.mark.slow  # two evaluations of 5,000 images x 10,000 captions, each fold re-ranked: ~20 s
def test_evaluate_coco_1k_rerank_with_the_models_own_s_tt(coco_like, tmp_path, capsys):
    """`evaluate --protocol coco1k5fold --rerank` with the checkpoint's S_TT (its own, or --text-model): each
    fold re-ranked with the neighbours the model gives among that fold's captions -- the paper's COCO 1K row."""
    import json

    import torch

    from vlmatch.cli import main
    from vlmatch.data.precomp import PrecompSplit

    root, model = coco_like
    base = ["evaluate", "--checkpoint", str(root / "mtfn"), "--data", str(root), "--split", "testall",
            "--protocol", "coco1k5fold", "--rerank", "--k-text", "3", "--no-progress"]
    assert main([*base, "--save-sims", str(tmp_path / "s.npy"), "--json", str(tmp_path / "own.json")]) == 0
    assert main([*base, "--text-model", str(root / "mtfn"), "--json", str(tmp_path / "tm.json")]) == 0
    own, tm = (json.loads((tmp_path / f).read_text())["rerank"] for f in ("own.json", "tm.json"))
    assert own["text"] == "S_TT" and own["k"] == 7 and own["k_text"] == 3 and own["after"] == tm["after"]
    assert "RR K=7, K'=3" in capsys.readouterr().out
    sims = np.load(tmp_path / "s.npy")
    split = PrecompSplit(root, "testall")
    for f in (0, 3):  # a fold alone: S_TT of its 2000 captions only, the single-set re-ranking
        fc = slice(2000 * f, 2000 * (f + 1))
        tokens, lengths = model.tokenize(split.captions[fc])
        with torch.no_grad():
            txt = model.encode_texts(tokens, lengths)
            tt = model.caption_scores(txt, txt).double().numpy()
        alone = evaluate_reranked(sims[1000 * f:1000 * (f + 1), fc], "single", k=7, k_text=3, text_sims=tt)["after"]
        assert own["after"]["folds"][f] == pytest.approx({k: alone[k] for k in own["after"]["folds"][f]})
