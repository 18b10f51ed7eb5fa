"""Every command ends bad input with one line and a non-zero exit, never a traceback (--debug shows it)."""

import argparse
import gc
import multiprocessing
import re

import numpy as np
import pytest

import vlmatch.models.registry as registry
from vlmatch.cli import build_parser, main
from vlmatch.data.precomp import PrecompSplit

from ..conftest import write_precomp


def _one_line(err):
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_ctrl_c_and_foreign_exceptions_are_one_line(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "describe_models", interrupted)
    assert main(["models"]) == 130
    assert _one_line(capsys.readouterr().err) == "vlmatch: interrupted\n"

    def foreign():
        raise ZeroDivisionError("float division by zero\nsecond line")

    monkeypatch.setattr(registry, "describe_models", foreign)
    assert main(["models"]) == 1
    err = _one_line(capsys.readouterr().err)
    assert err.startswith("vlmatch: error: ZeroDivisionError: float division by zero (unexpected; run with --debug")
    with pytest.raises(ZeroDivisionError):
        main(["models", "--debug"])


@pytest.mark.parametrize("array", [np.array([["a", "b"]] * 2), np.zeros((2, 2), dtype=[("x", "f4")]),
                                   np.ones((2, 2), dtype=complex), np.ones((2, 2), dtype=bool)])
def test_sims_that_are_not_real_numbers(tmp_path, capsys, array):
    np.save(tmp_path / "s.npy", array)
    assert main(["evaluate", "--sims", str(tmp_path / "s.npy")]) == 2
    assert "s.npy: a score matrix holds real numbers; this one holds dtype" in _one_line(capsys.readouterr().err)


def test_save_sims_keeps_large_scores_and_checks_the_path_first(tmp_path, capsys):
    sims = np.eye(3) * 1e300 + 1.0
    np.save(tmp_path / "s.npy", sims)
    assert main(["evaluate", "--sims", str(tmp_path / "s.npy"), "--save-sims", str(tmp_path / "out.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), sims)  # not inf (float32 overflow)
    assert main(["evaluate", "--sims", str(tmp_path / "out.npy")]) == 0
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    assert main(["evaluate", "--sims", str(tmp_path / "s.npy"), "--save-sims", str(tmp_path / "file" / "o.npy")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "o.npy: cannot be created: " in _one_line(err)  # refused before the table


def _tiny_precomp(root, nan_in=None):
    rng = np.random.default_rng(0)
    words = ["red", "blue", "cat", "dog", "big", "small"]
    for split, n in (("train", 40), ("dev", 10)):
        feats = rng.standard_normal((n, 3, 8)).astype(np.float32)
        if split == nan_in:
            feats[n - 3, 1, 2] = np.nan
        caps = [" ".join(rng.choice(words, 4)) for _ in range(n * 5)]
        write_precomp(root, split, feats, caps)
    return root


def _train(root, tmp_path, *sets):
    return main(["train", "--config", "quickstart_vsepp", "--run-dir", str(tmp_path / "run"), "--no-progress",
                 "--set", f"data.path={root}", "--set", "data.min_word_count=1", "--set", "train.epochs=1",
                 "--set", "train.batch_size=20", "--set", "train.threads=1", *[x for s in sets for x in ("--set", s)]])


@pytest.mark.parametrize("split", ["train", "dev"])
def test_nan_features_are_found_at_start(tmp_path, capsys, split):
    root = _tiny_precomp(tmp_path / "d", nan_in=split)
    assert _train(root, tmp_path) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{split}_ims.npy: image {37 if split == 'train' else 7} has NaN or inf features (found by the check" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # before a single step


def test_a_data_error_inside_a_dataloader_worker_is_one_line(tmp_path, capsys):
    root = _tiny_precomp(tmp_path / "d", nan_in="train")
    assert PrecompSplit(root, "train").n_images == 40
    # the check at start skipped (data.check_finite=false): the worker meets the bad image itself
    gc.disable()  # the failed run ends its DataLoader workers itself, not a later garbage collection (5 s a worker)
    try:
        assert _train(root, tmp_path, "data.check_finite=false", "train.workers=1") == 2
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()
    err = _one_line(capsys.readouterr().err)
    assert err.startswith("vlmatch: error: ") and "train_ims.npy: image 37 has NaN or inf features" in err


def _commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


def test_every_commands_help_prints(capsys):
    cmds = list(_commands(build_parser()))
    assert ("train",) in cmds and ("features", "extract") in cmds
    for cmd in cmds:
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0, cmd
    assert "train.lr=1e-4" in capsys.readouterr().out  # the example tests/training/test_rundir.py runs


@pytest.mark.parametrize("argv", [["evaluate", "--sims", "x.npy", "--max-images", "0"],
                                  ["features", "extract", "--images", "i", "--out", "o", "--batch-size", "-4"],
                                  ["data", "synth", "--out", "o", "--train", "0"]])
def test_counts_must_be_positive(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "expected an integer >= 1" in capsys.readouterr().err


def test_npz_archives_are_named_not_unexpected(tmp_path, capsys):
    np.savez(tmp_path / "s.npz", sims=np.eye(4), other=np.eye(2))
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random((4, 20)))
    assert main(["rerank", "--sims", str(tmp_path / "s.npz"), "--no-progress"]) == 2
    assert "s.npz: a .npz archive of 2 array(s)" in _one_line(capsys.readouterr().err)
    assert main(["evaluate", "--sims", str(tmp_path / "s.npz")]) == 2
    assert "not one .npy score matrix" in _one_line(capsys.readouterr().err)
    assert main(["rerank", "--sims", str(tmp_path / "s.npy"), "--text-sims", str(tmp_path / "s.npz"), "--no-progress"]) == 2
    assert "s.npz: a .npz archive" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["rerank", "--sims", "S", "--json", "DIR", "--no-progress"],
                                  ["vocab", "build", "--captions", "CAPS", "--min-count", "1", "--out", "DIR"],
                                  ["explain", "--model", "nowhere", "--image", "x.jpg", "--text", "a dog", "--out", "DIR"],
                                  ["explain", "--model", "nowhere", "--image", "x.jpg", "--text", "a dog", "--out",
                                   "o.png", "--json", "DIR"]])
def test_outputs_that_are_folders_are_refused_before_any_work(tmp_path, capsys, argv):
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random((4, 20)))
    (tmp_path / "caps.txt").write_text("a red dog\n")
    (tmp_path / "dir").mkdir()
    subst = {"S": str(tmp_path / "s.npy"), "DIR": str(tmp_path / "dir"), "CAPS": str(tmp_path / "caps.txt")}
    assert main([subst.get(x, x) for x in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{tmp_path / 'dir'}: is a folder; give a file name" in _one_line(err)


@pytest.mark.parametrize("text", ["", "   "])
def test_explain_refuses_an_empty_caption(text, capsys):
    assert main(["explain", "--model", "nowhere", "--image", "x.jpg", "--text", text, "--out", "o.png"]) == 2
    assert "--text is empty" in _one_line(capsys.readouterr().err)


class _NotWeights:  # pickled by torch.save: PyTorch's safe loader refuses it with a long UnpicklingError
    pass


@pytest.mark.parametrize("weights,says", [
    ("missing.pth", "missing.pth: not found (the --weights file for backbone {bb})"),
    ("text.pth", "text.pth: not a weights file (the --weights file for backbone {bb}): PyTorch cannot "
                 "read it as a state dict"),
    ("pickle.pth", "pickle.pth: not a weights file (the --weights file for backbone {bb}): PyTorch "
                   "cannot read it as a state dict (UnpicklingError: "),
    ("list.pth", "list.pth: not a weights file (the --weights file for backbone {bb}): it holds no "
                 "state dict of tensors"),
    ("other.pth", "other.pth: not weights of {bb} (the --weights file for backbone {bb}): "),
    ("DIR", "DIR: is not a file (the --weights file for backbone {bb})"),
])
def test_index_build_names_a_weights_file_it_cannot_use(tmp_path, capsys, weights, says):
    import torch
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "imgs" / "a.jpg")
    (tmp_path / "text.pth").write_text("not weights\n")
    torch.save({"w": _NotWeights()}, tmp_path / "pickle.pth")
    torch.save({"w": [1, 2]}, tmp_path / "list.pth")
    torch.save({"w": torch.zeros(2)}, tmp_path / "other.pth")
    (tmp_path / "DIR").mkdir()
    assert main(["index", "build", "--images", str(tmp_path / "imgs"), "--out", str(tmp_path / "idx"),
                 "--weights", str(tmp_path / weights), "--no-progress"]) == 2
    from vlmatch import pretrained

    bb = pretrained.get(pretrained.default_pair()[0]).features["name"]  # the shipped default's backbone
    err = _one_line(capsys.readouterr().err)
    assert f"vlmatch: error: {tmp_path / says.format(bb=bb)}" in err
    if weights == "other.pth":  # every one of the backbone's tensors is missing from it
        assert re.search(r": (\d+) of its \1 tensors missing", err), err
    assert not (tmp_path / "idx" / "manifest.json").exists()


@pytest.mark.parametrize("argv,name", [(["explain", "--model", "nowhere", "--image", "x.jpg", "--out", "o.png",
                                         "--text"], "--text"),
                                       (["search", "nowhere"], "the query text")])
def test_text_that_is_not_utf8_is_named(capsys, argv, name):
    text = b"a dog \xff\xfe on grass".decode("utf-8", "surrogateescape")  # as Python hands such argv bytes over
    assert main([*argv, text]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"vlmatch: error: {name} is not UTF-8 text (byte \\xff at character 7 of \"a dog \\xff\\xfe on grass\")" in err


def _quick_exit_to(stdout):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import vlmatch

    code = "from vlmatch.cli import quick_exit\nprint('rank score file')\nquick_exit(0)\n"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},  # the CLI's stdout is buffered
           "PYTHONPATH": str(Path(vlmatch.__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=60)


def test_a_failing_write_at_the_quick_exit_is_an_error_but_a_closed_pipe_is_not():
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        r = _quick_exit_to(full)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "vlmatch: error: writing standard output failed: No space left on device"]
    rd, wr = os.pipe()
    os.close(rd)  # the reader went away (`| head -1`)
    with os.fdopen(wr, "w") as closed:
        r = _quick_exit_to(closed)
    assert r.returncode == 0 and r.stderr == ""


def test_a_negative_latitude_or_longitude_is_a_value_not_an_option():
    from vlmatch.cli import _negative_values

    parser = build_parser()
    argv = ["search", "idx", "a dog", "--near", "-33.87,-151.21,10", "-k", "3"]
    a = parser.parse_args(_negative_values(parser, argv))
    assert a.near == "-33.87,-151.21,10" and a.k == 3
    assert "--near -33.87,151.21,10" in " ".join(parser._subparsers._group_actions[0].choices["search"]
                                                  .format_help().split())


def test_explain_to_a_folder_that_takes_no_files_is_refused_before_any_work(capsys, tmp_path):
    import os

    if not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    (tmp_path / "p.jpg").write_bytes(b"")
    assert main(["explain", "--image", str(tmp_path / "p.jpg"), "--text", "a dog", "--out", "/proc/x.png"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("vlmatch: error: /proc/x.png: cannot be created: /proc takes "
                                                        "no new files")
