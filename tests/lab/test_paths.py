"""vlmatch_lab.paths: the rooms' one cache root ($VLMATCH_CACHE, the library's own root) and their data folder
($VLMATCH_DATA, default 'shared' beside the checkout), and the roots a recipe writes its paths from."""

from pathlib import Path

import pytest

from vlmatch.data.resolve import cache_dir
from vlmatch_lab import paths
from vlmatch_lab.paths import cache_root, data_root, expand, portable

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_cache_root_is_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.setenv("VLMATCH_CACHE", "~/elsewhere")
    assert cache_root() == Path.home() / "elsewhere"


def test_the_cache_root_defaults_to_the_users_cache_folder_as_the_librarys_does(monkeypatch, tmp_path):
    monkeypatch.delenv("VLMATCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "vlmatch" == cache_dir()  # one root: the library's caches and the rooms'


def test_the_data_root_is_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_DATA", str(tmp_path))
    assert data_root() == tmp_path


def test_the_data_root_defaults_to_shared_beside_the_checkout(monkeypatch):
    monkeypatch.delenv("VLMATCH_DATA", raising=False)
    assert paths.CHECKOUT == CHECKOUT
    assert data_root(check=False) == CHECKOUT.parent / "shared"


def test_a_missing_data_folder_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as e:
        data_root()
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1 and f"VLMATCH_DATA={tmp_path / 'nowhere'}" in msg and "set VLMATCH_DATA" in msg
    assert data_root(check=False) == tmp_path / "nowhere"  # the path alone, for a default shown in help
    monkeypatch.delenv("VLMATCH_DATA")  # the default missing: the message says which variable moves it
    monkeypatch.setattr(paths, "CHECKOUT", tmp_path / "checkout")
    with pytest.raises(SystemExit) as e:
        data_root()
    msg = str(e.value.code)
    assert len(msg.splitlines()) == 1 and str(tmp_path / "shared") in msg and "set VLMATCH_DATA" in msg


def test_a_recipes_roots_expand_to_this_machines_folders_and_back(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VLMATCH_DATA", str(tmp_path / "data"))
    assert expand("$VLMATCH_CACHE/runs/a/best") == str(tmp_path / "cache" / "runs" / "a" / "best")
    assert expand("${VLMATCH_DATA}/flickr30k_entities") == str(tmp_path / "data" / "flickr30k_entities")
    assert expand("$VLMATCH_CACHE") == str(tmp_path / "cache")
    for other in ("toy", "/abs/x", "$VLMATCH_CACHEX/a", "both"):  # anything else as it is
        assert expand(other) == other
    assert portable(str(tmp_path / "cache" / "runs" / "a" / "best")) == "$VLMATCH_CACHE/runs/a/best"
    assert portable(str(tmp_path / "data" / "flickr30k_entities")) == "$VLMATCH_DATA/flickr30k_entities"
    # recorded before the cache had a root of its own: in benchmarks/cache/ of some checkout
    assert portable("/elsewhere/repo/benchmarks/cache/runs/a/best") == "$VLMATCH_CACHE/runs/a/best"
    assert portable("benchmarks/cache/calibration/x") == "$VLMATCH_CACHE/calibration/x"
    assert portable("/elsewhere/x") == "/elsewhere/x" and portable(None) is None
    assert expand(portable(str(tmp_path / "cache" / "x"))) == str(tmp_path / "cache" / "x")
