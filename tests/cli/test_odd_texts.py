"""`vlmatch explain --text` (and `vlmatch search`'s query) says plainly what it does with a long or odd text, run as
users run it (its own process): a text longer than the model reads is drawn with a note naming the cut; a text of only
invisible characters is refused as an empty one is; one the model reads none of (emoji) is refused before any PNG is
written; words no installed font has glyphs for get a plain label and one note line, not boxes and matplotlib's glyph
warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import vlmatch
from tests.search.photo_index import photo_index  # noqa: F401 (the session's index fixture)

SRC = Path(vlmatch.__file__).resolve().parents[1]
MODEL = "pretrained:vsepp-minilm-f8k"  # MiniLM text side: at most 64 tokens


def _explain(tmp_path, text) -> subprocess.CompletedProcess:
    photo = tmp_path / "p.jpg"
    if not photo.exists():
        Image.new("RGB", (320, 240), (90, 160, 70)).save(photo)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", "explain", "--model", MODEL, "--image", str(photo),
                           "--no-mirror", "--text", text, "--out", str(tmp_path / "maps.png")],
                          capture_output=True, text=True, env=env, timeout=300)


def _notes(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.startswith("vlmatch: note:")]


@pytest.mark.slow  # the shipped default's explain in a process of its own
def test_a_text_longer_than_the_model_reads_is_drawn_with_the_cut_named(tmp_path):
    text = " ".join(["a brown dog runs across the green grass"] * 120)  # 5,000 characters, ~960 tokens
    assert len(text) > 4500
    r = _explain(tmp_path, text)
    assert r.returncode == 0, r.stderr
    (note,) = [n for n in _notes(r) if "tokens" in n]
    assert "the model reads its first 64 (up to" in note and "the rest is neither scored nor drawn" in note
    assert (tmp_path / "maps.png").is_file() and "Traceback" not in r.stderr


@pytest.mark.slow  # the shipped default's index build per case
@pytest.mark.parametrize("text", ["\u200b\u200b\u200b", "\u200b \u2060"])
def test_a_text_of_only_invisible_characters_is_refused_like_an_empty_one(tmp_path, text):
    r = _explain(tmp_path, text)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("vlmatch: error: --text holds only invisible characters (U+200B")
    assert not (tmp_path / "maps.png").exists()


@pytest.mark.slow  # the shipped default's explain in a process of its own
def test_a_text_the_model_reads_none_of_is_refused_before_any_png(tmp_path):
    r = _explain(tmp_path, "\U0001f436\U0001f3d6\ufe0f\U0001f31e")
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "the model reads none of its words (its tokenizer made only [UNK] of it): nothing to draw" in err
    assert not (tmp_path / "maps.png").exists()


@pytest.mark.slow  # the shipped default's explain in a process of its own
def test_words_without_glyphs_get_a_plain_label_and_one_note_not_boxes(tmp_path):
    from vlmatch.viz.fonts import font_for, plain

    r = _explain(tmp_path, "狗在草地上跑")
    assert r.returncode == 0, r.stderr
    assert "Glyph" not in r.stderr and "missing from font" not in r.stderr, r.stderr  # no box was drawn
    assert (tmp_path / "maps.png").is_file()
    if font_for("地") is not None:  # a CJK font is installed here: the words are drawn, nothing to say
        assert not [n for n in _notes(r) if "font" in n]
        return
    (note,) = [n for n in _notes(r) if "font" in n]
    assert "no installed font draws" in note and "'地'" in note and "labelled by code point" in note
    assert plain("狗在") == "U+72D7 U+5728" and plain("狗在草地") == "U+72D7 U+5728 U+8349 ..."


def _search(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_query_of_only_invisible_characters_is_refused_like_an_empty_one(photo_index):  # noqa: F811
    for text, says in (("", "the query text is empty"), ("\u200b\u200b", "the query text holds only invisible "
                                                                           "characters (U+200B)")):
        r = _search("search", photo_index, text)
        err = r.stderr.strip()
        assert r.returncode == 2 and err == f"vlmatch: error: {says}: give the words to search for", err
