"""vlmatch_lab.inputs: a missing input ends a script of the rooms with one line saying what to run (or set) first."""

import sys

import pytest

from vlmatch_lab.inputs import need_features, need_run, need_shared


def _one_line(fn, *args) -> str:
    with pytest.raises(SystemExit) as e:
        fn(*args)
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1, msg
    return msg


def test_each_missing_input_names_what_makes_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/search.py"])
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VLMATCH_DATA", str(tmp_path / "data"))
    msg = _one_line(need_features)  # the study's feature cache: experiments/flickr8k.py makes it
    assert msg.startswith("benchmarks/search.py: ") and str(tmp_path / "cache" / "flickr8k-efficientnet-lite0") in msg
    assert "python experiments/flickr8k.py --extract-only" in msg
    assert "vlmatch features extract ... --out" in _one_line(need_features, tmp_path / "mine")  # another: by hand
    assert "a trained checkpoint" in _one_line(need_run, tmp_path / "cache" / "runs" / "r" / "best")
    msg = _one_line(need_shared)  # no command makes the data: the message names the variable that finds it
    assert str(tmp_path / "data" / "flickr8k" / "dataset_flickr8k.json") in msg and "$VLMATCH_DATA" in msg
    assert "Flickr8k is not shipped with vlmatch" in msg


def test_present_inputs_pass(tmp_path):
    for name in ("dev_ims.npy", "dev_caps.txt", "config.json"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "images").mkdir()
    (tmp_path / "dataset_flickr8k.json").write_text("{}")
    need_features(tmp_path)
    need_run(tmp_path)
    need_shared(tmp_path)
