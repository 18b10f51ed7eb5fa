"""vlmatch.data.resolve: where the caches are, and paths a config writes portably."""

from __future__ import annotations

from pathlib import Path

from vlmatch.data.resolve import cache_dir, expand_path


def test_cache_dir_is_the_variable_or_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("VLMATCH_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "vlmatch"


def test_expand_path_reads_the_cache_root_set_or_not(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    assert expand_path("$VLMATCH_CACHE/runs/a/best") == f"{tmp_path}/runs/a/best"
    assert expand_path("${VLMATCH_CACHE}/x") == f"{tmp_path}/x"
    monkeypatch.delenv("VLMATCH_CACHE")
    assert expand_path("$VLMATCH_CACHE/x") == str(Path.home() / ".cache" / "vlmatch" / "x")
    monkeypatch.setenv("SOMEWHERE", "/data")
    assert expand_path("$SOMEWHERE/flickr8k") == "/data/flickr8k" and expand_path("plain/path") == "plain/path"


def test_only_the_cache_variable_itself_is_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    monkeypatch.delenv("VLMATCH_CACHE_DIR", raising=False)
    assert expand_path("$VLMATCH_CACHE_DIR/x") == "$VLMATCH_CACHE_DIR/x"  # another (unset) variable, left as written
