"""A damaged, hand-edited or unsuitable index input ends with one line naming the file and the problem
(exit 2), never an "unexpected" error: index files, build options, outputs, caption files, file names."""

import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.cli import main
from vlmatch.cli.search import format_results
from vlmatch.data.vocab import Vocab
from vlmatch.search import build as B
from vlmatch.search import inputs
from vlmatch.search.backends.folder import COLLECTION_FILES, seal
from vlmatch.search.checks import MAX_CAPTION_TOKENS
from vlmatch.search.index import SearchHit
from vlmatch.weights import sha256_file

from ..conftest import write_precomp
from .test_build_images import build, jpegs, tiny_backbone  # noqa: F401  (the fixture registers Tiny32)

WORDS = ["red", "blue", "cat", "dog", "big", "small"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """An untrained VSE++ (8-d features), a precomp split of 40 images, 30 captions, and their index."""
    root = tmp_path_factory.mktemp("idx_errors")
    rng = np.random.default_rng(0)
    caps = [" ".join(rng.choice(WORDS, 4)) for _ in range(200)]
    write_precomp(root / "data", "test", rng.standard_normal((40, 3, 8)).astype(np.float32), caps)
    vocab = Vocab.build(caps, 1)
    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=8, embed_dim=16, word_dim=8, vocab_size=len(vocab))
    model.vocab = vocab
    model.save(root / "ckpt")
    (root / "caps.txt").write_text("\n".join(caps[:30]) + "\n", encoding="utf-8")
    assert build_args(root, root / "index", "--captions", str(root / "caps.txt")) == 0
    return root


def build_args(root, out, *extra):
    return main(["index", "build", "--model", str(root / "ckpt"), "--features", str(root / "data"), "--split", "test",
                 "--out", str(out), "--no-progress", *extra])


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err and "unexpected" not in err, err
    return err


def edit_json(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)  # edits in place
    path.write_text(json.dumps(obj))


def set_kind(kind):
    return lambda m: m["collections"]["images"]["stage1"].update(kind=kind)


def drop_ids(items):
    for it in items:
        del it["id"]


# name: (file, change, words the error must say). The manifest's per-file SHA-256 and its seal catch most
# damage before any reader parses a file; the readers' own checks (a FAISS file that is not one, a pickled
# .npy, rows without ids) stay behind them for what no hash covers.
HASHED = "content does not match the SHA-256 recorded in manifest.json"
TAMPERING = {
    "faiss garbage": ("images/stage1.faiss", lambda p: p.write_bytes(b"garbage" * 9), HASHED),
    "faiss empty": ("images/stage1.faiss", lambda p: p.write_bytes(b""), HASHED),
    "faiss missing": ("images/stage1.faiss", lambda p: p.unlink(), "stage1.faiss: file not found"),
    "faiss of the captions": ("images/stage1.faiss", lambda p: shutil.copy(p.parent.parent / "captions/stage1.faiss", p),
                              HASHED),
    "npy truncated": ("images/stage1.npy", lambda p: p.write_bytes(p.read_bytes()[:300]), HASHED),
    "npy header cut": ("images/stage1.npy", lambda p: p.write_bytes(p.read_bytes()[:100]), HASHED),
    "npy pickle": ("images/stage1.npy", lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True),
                   HASHED),
    "manifest a list": ("manifest.json", lambda p: p.write_text("[1, 2]"), "manifest.json: an index manifest is a JSON "
                                                                           "object, this one is a list"),
    "stage1 info a list": ("manifest.json", lambda p: edit_json(p, lambda m: m["collections"]["images"].update(stage1=[])),
                           "collection 'images' lacks its 'stage1' description"),
    "kind edited to ivf": ("manifest.json", lambda p: edit_json(p, set_kind("ivf")),
                           "manifest.json: edited after the index was written"),
    "kind edited to hnsw": ("manifest.json", lambda p: edit_json(p, set_kind("hnsw")),
                            "manifest.json: edited after the index was written"),
    "kind unknown": ("manifest.json", lambda p: edit_json(p, set_kind("lsh")), "stage-1 kind 'lsh' is not one of"),
    "items without id": ("images/items.json", lambda p: edit_json(p, drop_ids), HASHED),
    "items an object": ("images/items.json", lambda p: p.write_text("{}"), HASHED),
    "duplicate ids": ("captions/items.json", lambda p: edit_json(p, lambda it: it[1].update(id=0)), HASHED),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_damaged_index_files_are_named(made, tmp_path, capsys, case):
    idx = tmp_path / "index"
    shutil.copytree(made / "index", idx)
    rel, change, words = TAMPERING[case]
    change(idx / rel)
    query = ["red dog"] if "captions" not in rel else ["--image", str(made / "nothing.jpg")]
    assert main(["search", str(idx), *query]) == 2
    err = one_line(capsys.readouterr().err)
    assert words in err and f"vlmatch: error: {idx}/" in err, err  # names the file of the index


def reseal(idx):
    """Record the index's files as they are now and seal its manifest again: damage that the index's
    own records vouch for (as a bug, or a hand-made index, would leave)."""
    m = json.loads((idx / "manifest.json").read_text())
    for c, info in m["collections"].items():
        info["files"] = {n: sha256_file(idx / c / n) for n in COLLECTION_FILES}
    m["seal"] = seal(m)
    (idx / "manifest.json").write_text(json.dumps(m))


BEHIND_THE_SEAL = {  # the readers' own checks, beneath the hashes: what each says of a damage its records vouch for
    "faiss garbage": "not a readable FAISS index",
    "faiss empty": "stage1.faiss: empty file",
    "faiss of the captions": "holds 30 vectors of dimension 16 but stage1.npy beside it holds 40",
    "npy truncated": "not a readable .npy array",
    "npy header cut": "not a readable .npy array",
    "npy pickle": "not a readable .npy array",
    "kind edited to ivf": "holds a flat index but the manifest says 'ivf'",
    "kind edited to hnsw": "holds a flat index but the manifest says 'hnsw'",
    "items without id": "items.json: row 0 has no integer 'id'",
    "items an object": "the item table is a JSON list",
    "duplicate ids": "id 0 appears twice",
}


@pytest.mark.parametrize("case", list(BEHIND_THE_SEAL))
def test_damage_behind_a_valid_seal_is_named(made, tmp_path, capsys, case):
    idx = tmp_path / "index"
    shutil.copytree(made / "index", idx)
    rel, change, _ = TAMPERING[case]
    change(idx / rel)
    reseal(idx)
    query = ["red dog"] if "captions" not in rel else ["--image", str(made / "nothing.jpg")]
    assert main(["search", str(idx), *query]) == 2
    err = one_line(capsys.readouterr().err)
    assert BEHIND_THE_SEAL[case] in err and f"vlmatch: error: {idx}/" in err, err


def test_an_ivf_index_keeps_the_list_count_of_its_file(made, tmp_path, capsys):
    assert build_args(made, tmp_path / "ivf", "--ann", "ivf", "--nlist", "4") == 0
    edit_json(tmp_path / "ivf/manifest.json", lambda m: m["collections"]["images"]["stage1"].pop("nlist"))
    reseal(tmp_path / "ivf")  # a manifest without nlist that its seal vouches for: no KeyError 'nlist'
    capsys.readouterr()
    assert main(["search", str(tmp_path / "ivf"), "red dog", "-k", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_an_ivf_index_searches_and_its_list_count_cannot_be_edited(made, tmp_path, capsys):
    assert build_args(made, tmp_path / "ivf", "--ann", "ivf", "--nlist", "4") == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "ivf"), "red dog", "-k", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    edit_json(tmp_path / "ivf/manifest.json", lambda m: m["collections"]["images"]["stage1"].pop("nlist"))
    assert main(["search", str(tmp_path / "ivf"), "red dog", "-k", "3"]) == 2  # the seal: no KeyError 'nlist'
    assert "manifest.json: edited after the index was written" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("args,words", [
    (["--batch-size", "0"], "argument --batch-size: expected an integer >= 1"),
    (["--ann", "ivf", "--nlist", "-5"], "argument --nlist: expected an integer >= 1"),
    (["--ann", "ivf", "--nlist", "100000"], "--nlist 100000 asks for more IVF lists than the 40 items"),
])
def test_bad_build_options(made, tmp_path, capsys, args, words):
    try:
        rc = build_args(made, tmp_path / "o", *args)
    except SystemExit as e:  # argparse
        rc = e.code
    assert rc == 2 and words in capsys.readouterr().err


def test_nlist_beyond_the_captions_is_refused_before_any_encoding(made, tmp_path, capsys):
    assert build_args(made, tmp_path / "o", "--ann", "ivf", "--nlist", "35", "--captions", str(made / "caps.txt")) == 2
    assert "more IVF lists than the 30 captions" in one_line(capsys.readouterr().err)
    assert not any((tmp_path / "o" / part).exists() for part in ("build", "images", "manifest.json"))  # nothing encoded


def test_a_missing_image_folder_is_named_and_no_out_folder_is_made(toy_ckpts, tmp_path, capsys):
    assert build(toy_ckpts, tmp_path / "nope", tmp_path / "o") == 2
    assert f"{tmp_path / 'nope'}: image folder not found" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()  # before: a folder holding only a lock file


def test_out_folder_that_cannot_be_made(made, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert build_args(made, tmp_path / "file") == 2
    assert "is a file; --out names the index folder" in one_line(capsys.readouterr().err)
    assert build_args(made, tmp_path / "file" / "sub") == 2
    assert "cannot be created or written in" in one_line(capsys.readouterr().err)
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        assert build_args(made, "/proc/vlmatch-index") == 2  # root may "write" there by os.access, never really
        assert "/proc/vlmatch-index: cannot be created or written in" in one_line(capsys.readouterr().err)


def test_search_json_to_a_folder_is_refused_before_the_table(made, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert main(["search", str(made / "index"), "red dog", "--json", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "out: is a folder; give a file name" in one_line(err)


def test_a_caption_too_long_to_index_is_named_before_any_encoding(made, tmp_path, capsys):
    lines = ["a red dog"] * 5 + [" ".join(["dog"] * 20_000)] + ["a cat"] * 45
    (tmp_path / "caps.txt").write_text("\n".join(lines) + "\n")
    assert build_args(made, tmp_path / "o", "--captions", str(tmp_path / "caps.txt")) == 2
    err = one_line(capsys.readouterr().err)
    assert f"caps.txt: line 6 has 20002 tokens; captions of at most {MAX_CAPTION_TOKENS} are indexed" in err
    assert not any((tmp_path / "o" / part).exists() for part in ("build", "images", "manifest.json"))  # none encoded
    lines[5] = " ".join(["dog"] * (MAX_CAPTION_TOKENS - 2))  # <start> ... <end>: exactly the cap
    (tmp_path / "caps.txt").write_text("\n".join(lines) + "\n")
    assert build_args(made, tmp_path / "o", "--captions", str(tmp_path / "caps.txt")) == 0


def test_a_build_interrupted_after_the_images_resumes(made, tmp_path, monkeypatch, capsys):
    real = B.encode_sharded

    def fail(work, part, *a, **k):
        if part.name == "captions":
            raise KeyboardInterrupt("killed while indexing the captions")
        return real(work, part, *a, **k)

    monkeypatch.setattr(B, "encode_sharded", fail)
    assert build_args(made, tmp_path / "o", "--captions", str(made / "caps.txt")) == 130
    # the images are encoded (kept in build/ for the resume); no part is swapped in before every part is ready
    assert (tmp_path / "o/build/images").is_dir() and not (tmp_path / "o/images").exists()
    monkeypatch.setattr(B, "encode_sharded", real)
    assert build_args(made, tmp_path / "o", "--captions", str(made / "caps.txt")) == 0
    assert main(["search", str(tmp_path / "o"), "red dog"]) == 0


# --- file names and files of an image folder ----------------------------------------------------

def test_result_table_rows_stay_one_line():
    rows = [SearchHit(1, 0, 0.5, 0.25, path="/p/caf\udce9.jpg"), SearchHit(2, 1, 0.4, 0.2, path="/p/a\nb\tc.jpg")]
    table = format_results(rows, "file")
    assert table.splitlines()[1:] == ["   1    0.5000    0.2500  /p/caf\\xe9.jpg", "   2    0.4000    0.2000  /p/a\\nb\\tc.jpg"]
    table.encode("utf-8")  # printable in any UTF-8 terminal


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that takes any bytes in a name")
def test_names_that_are_not_utf8_are_indexed_and_shown_escaped(toy_ckpts, tmp_path, capsys):
    photos = jpegs(tmp_path / "photos", ["a.jpg", "b.jpg"])
    os.rename(photos / "a.jpg", os.fsdecode(os.fsencode(photos) + b"/caf\xe9.jpg"))
    os.rename(photos / "b.jpg", photos / "new\nline.jpg")
    assert build(toy_ckpts, photos, tmp_path / "idx") == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a dog", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 3 and "caf\\xe9.jpg" in out and "new\\nline.jpg" in out
    found = json.loads((tmp_path / "r.json").read_text())["results"]
    assert {os.path.exists(r["path"]) for r in found} == {True}  # the JSON keeps the real names


def test_a_file_deleted_after_encoding_keeps_the_row_of_what_was_encoded(toy_ckpts, tmp_path, monkeypatch):
    """The row is made from the one read that was encoded (size, mtime, hash), so a file gone before the table
    is written breaks nothing; the next update drops it."""
    photos = jpegs(tmp_path / "photos", ["a.jpg", "b.jpg", "c.jpg"])
    real_load = inputs.load_image

    def load_then_delete(data, size):
        out = real_load(data, size)
        if data.path.name == "b.jpg":
            data.path.unlink()  # gone between encoding and the table write
        return out

    monkeypatch.setattr(inputs, "load_image", load_then_delete)
    assert build(toy_ckpts, photos, tmp_path / "idx", "--skip-bad") == 0
    items = json.loads((tmp_path / "idx/images/items.json").read_text())
    assert len(items) == 3 and all(isinstance(it["sha256"], str) for it in items)
    monkeypatch.setattr(inputs, "load_image", real_load)
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0  # the update drops it
    assert [it["rel"] for it in json.loads((tmp_path / "idx/images/items.json").read_text())] == ["a.jpg", "c.jpg"]
