"""CLI paths that tie models, data and metrics together."""

import json

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.cli import main
from vlmatch.data.precomp import PrecompSplit
from vlmatch.data.vocab import Vocab
from vlmatch.evaluation.metrics import evaluate_protocol
from vlmatch.evaluation.scoring import model_scores


@pytest.mark.slow  # scores 200 x 1000 pairs with two SCAN models three times (5-12 s)
def test_evaluate_checkpoint_ensemble_averages_score_matrices(small_world, tmp_path, capsys):
    sp = PrecompSplit(small_world, "test")
    vocab = Vocab.build(PrecompSplit(small_world, "train").captions, 1)
    mats = []
    for i, name in enumerate(("scan_t2i_avg", "scan_i2t_lse")):
        torch.manual_seed(i)
        m = create_model(name, img_dim=sp.img_dim, embed_dim=16, word_dim=8, vocab_size=len(vocab))
        m.vocab = vocab
        m.save(tmp_path / name)
        mats.append(model_scores(m, sp, vocab, progress=False))
    args = ["evaluate", "--checkpoint", str(tmp_path / "scan_t2i_avg"), str(tmp_path / "scan_i2t_lse"),
            "--data", str(small_world), "--split", "test", "--save-sims", str(tmp_path / "ens.npy"),
            "--json", str(tmp_path / "r.json"), "--no-progress"]
    assert main(args) == 0
    ens = np.load(tmp_path / "ens.npy")
    np.testing.assert_allclose(ens, (mats[0].astype(np.float64) + mats[1]) / 2, atol=1e-6)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["rsum"] == pytest.approx(evaluate_protocol(ens, "single")["rsum"])
    assert "ensemble of 2" in capsys.readouterr().out


def test_cli_errors_are_one_line_without_traceback(tmp_path, capsys):
    assert main(["evaluate", "--checkpoint", str(tmp_path / "nope"), "--data", "x"]) == 2
    err = capsys.readouterr().err
    assert "config.json not found" in err and "Traceback" not in err
    assert main(["train", "--config", "does_not_exist"]) == 2
    assert "config not found" in capsys.readouterr().err
    assert main(["data", "check", "--data", str(tmp_path), "--split", "train"]) == 2
    assert "train_ims.npy: feature file not found" in capsys.readouterr().err


def test_vocab_build_and_data_synth_commands(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path / "w"), "--train", "20", "--dev", "10", "--test", "10"]) == 0
    assert main(["vocab", "build", "--captions", str(tmp_path / "w" / "train_caps.txt"), "--min-count", "2",
                 "--out", str(tmp_path / "v.json")]) == 0
    v = Vocab.load(tmp_path / "v.json")
    assert len(v) > 10 and "<unk>" in v
    assert main(["models"]) == 0
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "scan_t2i_avg" in listing
    assert "all-MiniLM-L6-v2" in listing["mmca"] and "BERT-base" in listing["mmca"]  # default vs the paper's encoder


@pytest.mark.slow  # a quickstart training
def test_quickstart_command_prints_table_and_json(small_world, tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(f"model: {{name: vsepp, embed_dim: 16, word_dim: 8}}\n"
                   f"data: {{path: {small_world}, val_max_images: 50, min_word_count: 1}}\n"
                   f"train: {{epochs: 1, batch_size: 64, max_steps_per_epoch: 3, threads: 1}}\n")
    assert main(["quickstart", "--models", str(cfg), "--run-dir", str(tmp_path / "q"),
                 "--json", str(tmp_path / "q.json")]) == 0
    out = capsys.readouterr().out
    assert "rsum" in out and "vsepp" in out
    res = json.loads((tmp_path / "q.json").read_text())
    assert res["results"]["vsepp"]["n_images"] == 200 and 0 <= res["results"]["vsepp"]["rsum"] <= 600


@pytest.mark.slow  # seconds
def test_evaluate_top_k_is_two_stage_and_k_everything_equals_exhaustive(small_world, tmp_path, capsys):
    """--top-k K: stage 1 by SMAN's global part (d0 + d1), the full score on each query's top K; with K
    at least every candidate the rankings are the exhaustive ones, with K = 1 they differ."""
    sp = PrecompSplit(small_world, "test", max_images=30)
    vocab = Vocab.build(PrecompSplit(small_world, "train").captions, 1)
    torch.manual_seed(0)
    m = create_model("sman", img_dim=sp.img_dim, embed_dim=16, word_dim=8, attn_dim=6, vocab_size=len(vocab))
    m.vocab = vocab
    m.save(tmp_path / "m")
    exhaustive = evaluate_protocol(model_scores(m, sp, vocab, progress=False), "single")
    base = ["evaluate", "--checkpoint", str(tmp_path / "m"), "--data", str(small_world), "--split", "test",
            "--max-images", "30", "--no-progress"]
    assert main([*base, "--top-k", "150", "--json", str(tmp_path / "all.json")]) == 0
    r = json.loads((tmp_path / "all.json").read_text())
    assert r["top_k"] == 150 and r["protocol"] == "single, two-stage top 150"
    for key in ("rsum", "i2t_r1", "t2i_r1", "i2t_meanr", "t2i_meanr"):
        assert r[key] == pytest.approx(exhaustive[key]), key
    assert main([*base, "--top-k", "1", "--json", str(tmp_path / "one.json")]) == 0
    assert json.loads((tmp_path / "one.json").read_text())["t2i_meanr"] != pytest.approx(exhaustive["t2i_meanr"])
    assert "(top 1)" in capsys.readouterr().out
    assert main([*base, "--top-k", "5", "--rerank"]) == 2
    assert "--top-k needs exactly one --checkpoint" in capsys.readouterr().err


def test_evaluate_scores_a_calibrated_checkpoint_with_its_calibration_unless_told_not_to(small_world, tmp_path):
    from vlmatch.models.calibration import Calibration

    sp = PrecompSplit(small_world, "test", max_images=40)
    vocab = Vocab.build(PrecompSplit(small_world, "train").captions, 1)
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=sp.img_dim, embed_dim=16, word_dim=8, vocab_size=len(vocab))
    m.vocab = vocab
    raw = evaluate_protocol(model_scores(m, sp, vocab, progress=False), "single")
    with torch.no_grad():  # a caption bank on the first images: they are the hubs it pushes down
        hubs = m.encode_images(torch.from_numpy(np.array(sp.features[:10], np.float32))).embedding
    m.calibration = Calibration.fit(30.0, rank=16, text=hubs)
    m.save(tmp_path / "m")
    cal = evaluate_protocol(model_scores(m, sp, vocab, progress=False), "single")
    assert cal["t2i_meanr"] != pytest.approx(raw["t2i_meanr"])
    base = ["evaluate", "--checkpoint", str(tmp_path / "m"), "--data", str(small_world), "--split", "test",
            "--max-images", "40", "--no-progress"]
    for extra, want in (([], cal), (["--no-calibration"], raw), (["--no-calibration", "--top-k", "200"], raw),
                        (["--top-k", "200"], cal)):
        assert main([*base, *extra, "--json", str(tmp_path / "r.json")]) == 0
        got = json.loads((tmp_path / "r.json").read_text())
        for key in ("rsum", "t2i_meanr", "i2t_meanr"):
            assert got[key] == pytest.approx(want[key]), (extra, key)
