"""What a new user runs into first: data arguments, errors that say the fix, the Python API's setup."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import vlmatch
from vlmatch.cli import main
from vlmatch.data.precomp import PrecompSplit
from vlmatch.data.resolve import resolve_data
from vlmatch.data.vocab import Vocab
from vlmatch.errors import ConfigError
from vlmatch.training.config import BUNDLED, describe_configs
from vlmatch.viz.attention import pair_attention

from .conftest import write_precomp


@pytest.mark.slow  # writes the whole toy world
def test_toyworld_is_a_data_argument_of_every_command_and_lives_in_vlmatch_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "c"))
    assert resolve_data("toyworld") == tmp_path / "c" / "toyworld"  # read at call time
    assert resolve_data(None) == tmp_path / "c" / "toyworld"
    assert main(["data", "check", "--data", "toyworld", "--split", "test"]) == 0
    assert '"images": 1000' in capsys.readouterr().out
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VLMATCH_CACHE")
    assert resolve_data("toyworld") == tmp_path / "home" / ".cache" / "vlmatch" / "toyworld"


def test_a_run_folder_given_as_checkpoint_suggests_best(small_world, tmp_path, capsys):
    run = tmp_path / "run"
    m = vlmatch.create_model("vsepp", img_dim=32, embed_dim=8, word_dim=4, vocab=Vocab(["dog"]))
    m.save(run / "best")
    assert main(["evaluate", "--checkpoint", str(run), "--data", str(small_world), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"vlmatch: error: {run}: a run folder, not a checkpoint: use {run / 'best'} (best on validation)"


def test_split_val_on_a_folder_with_dev_suggests_dev(tmp_path, capsys):
    for split in ("train", "dev"):
        write_precomp(tmp_path, split, np.zeros((2, 3, 4)), ["a dog"] * 10)
    assert main(["data", "check", "--data", str(tmp_path), "--split", "val"]) == 2
    err = capsys.readouterr().err
    assert "val_ims.npy: feature file not found; this folder has splits dev, train: use --split dev" in err
    assert len(err.strip().splitlines()) == 1


def test_missing_flickr8k_says_where_the_data_comes_from(tmp_path, capsys):
    shared = tmp_path / "shared" / "flickr8k"
    assert main(["features", "extract", "--images", str(shared / "images"), "--annotations",
                 str(shared / "dataset_flickr8k.json"), "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert f"{shared / 'images'}: image folder not found; Flickr8k is not shipped with vlmatch" in err
    assert "Karpathy's dataset_flickr8k.json" in err and "Hodosh" in err and "../shared" not in err
    ck = vlmatch.create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab=Vocab()).save(tmp_path / "ck")
    assert main(["evaluate", "--checkpoint", str(ck), "--data", str(shared), "--split", "dev"]) == 2
    assert f"{shared}: data folder not found; Flickr8k is not shipped" in capsys.readouterr().err


@pytest.mark.slow  # seconds
def test_img_dim_mismatch_is_one_error_naming_both_numbers():
    m = vlmatch.create_model("scan_t2i_avg", img_dim=2048, embed_dim=8, word_dim=4, vocab_size=10)
    with pytest.raises(ConfigError, match=r"have 64 values per region, but model scan_t2i_avg was created "
                                          r"with img_dim=2048: create it with img_dim=64"):
        m.encode_images(torch.zeros(2, 8, 64))
    for name in vlmatch.list_models():  # every model, through forward too
        m = vlmatch.create_model(name, img_dim=16, vocab_size=10)
        if not m.checks_img_dim:  # a model whose input is not (..., img_dim) says so
            continue
        with pytest.raises(ConfigError, match="img_dim=16"):
            m(torch.zeros(1, 3, 12), None, torch.ones(1, 2, dtype=torch.long), torch.tensor([2]))


def test_create_model_with_a_vocab_saves_it_and_explains_after_loading(tmp_path):
    vocab = Vocab.build(["a red dog", "a blue car"], min_count=1)
    m = vlmatch.create_model("scan_t2i_avg", img_dim=6, embed_dim=8, word_dim=4, vocab=vocab)
    assert m.vocab is vocab and m.cfg.vocab_size == len(vocab)
    loaded = vlmatch.load_model(m.save(tmp_path / "ck"))
    assert loaded.vocab == vocab
    att = pair_attention(loaded, np.ones((3, 6)), "a red dog")
    assert att.words == ["<start>", "a", "red", "dog", "<end>"] and att.weights.shape == (3, 5)
    with pytest.raises(ConfigError, match="smaller than the vocabulary"):
        vlmatch.create_model("vsepp", vocab_size=3, vocab=vocab)


@pytest.mark.slow  # seconds
def test_explain_on_memory_mapped_features_warns_nothing(small_world, tmp_path):
    """torch warns once per process, so this runs in a fresh interpreter with warnings as errors."""
    vocab = Vocab.build(PrecompSplit(small_world, "train").captions, 1)
    vlmatch.create_model("scan_t2i_avg", img_dim=32, embed_dim=8, word_dim=4, vocab=vocab).save(tmp_path / "ck")
    code = ("import vlmatch; from vlmatch.data.precomp import PrecompSplit; from vlmatch.viz.attention import pair_attention\n"
            f"sp = PrecompSplit({str(small_world)!r}, 'test')\n"
            "assert not sp.features[0].flags.writeable  # memory-mapped, read-only\n"
            f"pair_attention(vlmatch.load_model({str(tmp_path / 'ck')!r}), sp.features[0], sp.captions[0])\n")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_configs_lists_each_config_with_its_first_comment_line(capsys):
    described = describe_configs()
    assert set(described) == {p.stem for p in BUNDLED.glob("*.yaml")}
    assert all(described.values()), [n for n, d in described.items() if not d]  # every bundled config has one
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(described)
    first = (BUNDLED / "scan_t2i_avg_f30k.yaml").read_text().splitlines()[0].lstrip("# ")
    assert any(ln.startswith("scan_t2i_avg_f30k ") and ln.endswith(first) for ln in lines)
