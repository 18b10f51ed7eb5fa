"""Every benchmark checks what it reads before its first expensive step and says in one line what to run
first: `python benchmarks/search.py default-scale --sizes 100000` on a fresh clone built a 100,000-image
index for five minutes, then died with a traceback (no dev_caps.txt)."""

import subprocess
import sys

import pytest

from tests.benchmark_scripts import BENCHMARKS, load_script


@pytest.fixture
def search(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))  # a fresh clone: no feature cache
    mod = load_script("search", "search_bench")
    assert mod.F8K == tmp_path / "flickr8k-efficientnet-lite0"
    monkeypatch.setattr(mod.search_default, "SHARED", tmp_path / "no-shared")

    def expensive(*a, **k):
        raise AssertionError("an expensive step ran before the inputs were checked")

    for name in ("default_scale", "default_build"):
        monkeypatch.setattr(mod.search_default, name, expensive)
    monkeypatch.setattr(mod, "real", expensive)
    monkeypatch.setattr(subprocess, "run", expensive)
    monkeypatch.setattr(sys, "argv", ["benchmarks/search.py"])
    return mod


EXTRACT = "python experiments/flickr8k.py --extract-only"


@pytest.mark.parametrize("argv,missing,first", [
    (["default-scale", "--sizes", "100000"], "flickr8k-efficientnet-lite0/dev_ims.npy", EXTRACT),
    (["default-scale-one", "--n", "10"], "flickr8k-efficientnet-lite0/dev_ims.npy", EXTRACT),
    (["real", "--pair", "default"], "flickr8k-efficientnet-lite0/dev_ims.npy", EXTRACT),
    (["default-build"], "no-shared/dataset_flickr8k.json", "Flickr8k is not shipped with vlmatch"),
])
def test_search_benchmarks_name_their_missing_input_first(search, tmp_path, argv, missing, first):
    with pytest.raises(SystemExit) as e:
        search.main(argv)
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1 and msg.startswith("benchmarks/search.py: ")
    assert f"{tmp_path / missing} is missing" in msg and first in msg


def test_a_present_feature_cache_passes_the_check(search, tmp_path):
    feats = tmp_path / "flickr8k-efficientnet-lite0"
    feats.mkdir()
    for name in ("dev_ims.npy", "dev_caps.txt"):
        (feats / name).write_bytes(b"")
    with pytest.raises(AssertionError, match="an expensive step ran"):  # past the check, into the work
        search.main(["default-scale-one", "--n", "10"])


@pytest.mark.parametrize("script,argv", [
    ("flickr8k_rerank", ["--run", "nope"]),
    ("flickr8k_ensemble", ["--name", "x", "--members", "nope", "nope2"]),
    ("scan_attention", ["--checkpoint", "nope/best"]),
    ("two_stage", ["--checkpoint", "nope/best"]),
])
def test_the_flickr8k_benchmarks_check_the_feature_cache_first(monkeypatch, tmp_path, script, argv):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))  # the rooms' one cache, empty
    mod = load_script(script, f"{script}_bench")
    for name in ("CACHE", "FEATURES"):  # the study's feature cache, in that cache
        assert getattr(mod, name, tmp_path / "flickr8k-efficientnet-lite0") == tmp_path / "flickr8k-efficientnet-lite0"
    if script in ("scan_attention", "two_stage"):
        argv += ["--features" if script == "scan_attention" else "--data", str(tmp_path / "flickr8k-efficientnet-lite0")]
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1 and f"{tmp_path / 'flickr8k-efficientnet-lite0'}/dev_ims.npy is missing" in msg, msg
    assert EXTRACT in msg
