"""An index never loses or mixes data and never gets stuck: what --out may hold, a kill at each step
of a build's or an update's commit (a child process dies there), two writers at once, a file changed
while it is encoded, parts swapped or edited after the build, and an update whose new files are all
unreadable."""

import hashlib
import json
import re
import shutil
import time

import faiss
import numpy as np
import pytest
import torch

import vlmatch
from vlmatch import io
from vlmatch.cli import main
from vlmatch.errors import DataError, VlmatchError
from vlmatch.features import backbones
from vlmatch.models.registry import load_model
from vlmatch.search import index as index_module

from .tiny import Tiny32, build_args, child, exhaustive, jpegs, run_child, tiny_backbone  # noqa: F401  (autouse)

NAMES = [f"im{i}.jpg" for i in range(6)]


def perturbed(ckpt, out, seed):
    """Another checkpoint of the same architecture and vocabulary (other weights)."""
    m = load_model(ckpt)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m.save(out)


@pytest.fixture(scope="module")
def ckpts(toy_ckpts, tmp_path_factory):
    """The toy SCAN (a) and VSE++ retriever, and other weights of both (b)."""
    root = tmp_path_factory.mktemp("other")
    return {"a": toy_ckpts["scan"], "b": perturbed(toy_ckpts["scan"], root / "scan_b", 1),
            "vsepp": toy_ckpts["vsepp"], "vsepp_b": perturbed(toy_ckpts["vsepp"], root / "vsepp_b", 2)}


def build(ckpts, images, out, *extra, model="a", retriever="vsepp"):
    return main(build_args(ckpts[model], images, out, *extra, retriever=ckpts[retriever]))


class Killed(BaseException):
    """A kill simulated in this process (where a child process would add only its start-up time)."""


def _raise(exc):
    raise exc


def files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- 1. what --out may hold ----------------------------------------------------------------------

def test_an_out_around_or_inside_the_photos_is_refused_and_nothing_is_touched(ckpts, tmp_path, capsys):
    proj = tmp_path / "proj"
    imgs = jpegs(proj / "images", NAMES)
    before = files(proj)
    for out, why in ((proj, "holds the image folder"), (imgs, "inside the image folder"),
                     (imgs / "index", "inside the image folder")):
        for extra in ((), ("--overwrite",)):
            assert build(ckpts, imgs, out, *extra) == 2
            err = capsys.readouterr().err.strip()
            assert why in err and len(err.splitlines()) == 1
    assert files(proj) == before and sorted(p.name for p in proj.iterdir()) == ["images"]


def test_an_out_that_is_not_an_index_is_refused_and_overwrite_keeps_what_is_not_the_indexs(ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    proj = tmp_path / "proj"  # someone's project: its names are an index's, but no index made them
    for rel, data in {"images/keep.jpg": b"photo", "build/Makefile": b"all:", "manifest.json": b'{"mine": 1}',
                      "model/weights.bin": b"w", "notes.txt": b"n"}.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_bytes(data)
    before = files(proj)
    assert build(ckpts, imgs, proj) == 2
    assert "holds files that are not a vlmatch index" in capsys.readouterr().err
    assert build(ckpts, imgs, proj, "--overwrite") == 2
    assert "build, images, manifest.json, model did not come from a vlmatch index" in capsys.readouterr().err
    assert files(proj) == before and sorted(p.name for p in proj.iterdir()) == ["build", "images", "manifest.json",
                                                                                 "model", "notes.txt"]
    # other files beside the index: --overwrite builds there, and rebuilds, and keeps them
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_bytes(b"mine")
    assert build(ckpts, imgs, out) == 2
    assert build(ckpts, imgs, out, "--overwrite") == 0
    assert build(ckpts, imgs, out, "--overwrite", model="b") == 0
    assert (out / "notes.txt").read_bytes() == b"mine" and len(vlmatch.Index.open(out)) == 6
    # an index of its own alone is rebuilt without the flag
    assert build(ckpts, imgs, tmp_path / "idx") == 0 and build(ckpts, imgs, tmp_path / "idx", model="b") == 0
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == [
        ".vlmatch.lock", ".vlmatch.read.lock", ".vlmatch.swap.lock", "images", "manifest.json", "model", "retriever"]


# --- 2. kills and concurrent writers: one whole index, never a mixed one -------------------------

@pytest.mark.slow  # builds killed in processes of their own
@pytest.mark.parametrize("step, found", [("new-in", "a"),           # images/ of model b in, model/ still a's
                                         ("commit:parts", "a"),     # every part of b in, the manifest still a's
                                         ("commit:manifest", "b")])  # b's manifest in, a's parts not yet removed
def test_a_rebuild_with_another_model_killed_at_each_step_leaves_one_whole_index(ckpts, tmp_path, monkeypatch, step,
                                                                                 found):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0 and build(ckpts, imgs, tmp_path / "ref_b", model="b") == 0
    ref = {"a": exhaustive(out), "b": exhaustive(tmp_path / "ref_b")}
    r = run_child(build_args(ckpts["b"], imgs, out, retriever=ckpts["vsepp"]), kill_at=step)
    assert r.returncode == 9, r.stderr  # it really died there
    assert exhaustive(out) == ref[found]
    monkeypatch.setattr(io, "crash_hook", lambda s: _raise(Killed) if s == "old-moved" else None)
    with pytest.raises(Killed):  # the re-run dies too, as it moves the first old part aside
        build(ckpts, imgs, out, model="b")
    monkeypatch.setattr(io, "crash_hook", None)
    assert exhaustive(out) == ref[found]
    Tiny32.images = 0
    assert build(ckpts, imgs, out, model="b") == 0  # the re-run finishes from build/: nothing encoded again
    assert Tiny32.images == 0 and exhaustive(out) == ref["b"]
    assert sorted(p.name for p in out.iterdir()) == [
        ".vlmatch.lock", ".vlmatch.read.lock", ".vlmatch.swap.lock", "images", "manifest.json", "model", "retriever"]


@pytest.mark.slow  # a build killed in a process of its own
def test_a_build_killed_in_its_final_phase_resumes(ckpts, tmp_path):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    r = run_child(build_args(ckpts["a"], imgs, tmp_path / "idx", retriever=ckpts["vsepp"]), kill_at="new-in")
    assert r.returncode == 9, r.stderr
    with pytest.raises(VlmatchError, match="interrupted; run the same `vlmatch index build` again"):
        vlmatch.Index.open(tmp_path / "idx")
    assert build(ckpts, imgs, tmp_path / "idx") == 0
    assert Tiny32.images == 0  # every image was encoded before the kill
    assert build(ckpts, imgs, tmp_path / "ref") == 0
    assert exhaustive(tmp_path / "idx") == exhaustive(tmp_path / "ref")


@pytest.mark.slow  # builds killed in processes of their own
@pytest.mark.parametrize("step", ["old-moved",  # images/ renamed to images.prev, the new one not yet in
                                  "new-in"])    # the new images/ in, the manifest not yet replaced
def test_an_update_killed_mid_swap_leaves_the_previous_index_and_ids_stay_unique(ckpts, tmp_path, capsys, monkeypatch,
                                                                                  step):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0
    jpegs(imgs, ["new0.jpg", "new1.jpg"], seed=3)
    (imgs / "im5.jpg").unlink()
    r = run_child(["index", "update", out, "--no-progress"], kill_at=step)
    assert r.returncode == 9, r.stderr
    assert sorted(it["rel"] for it in vlmatch.Index.open(out).items) == NAMES  # the index before the update
    monkeypatch.setattr(io, "crash_hook", lambda s: _raise(Killed) if s == "old-moved" else None)
    with pytest.raises(Killed):  # the next update dies too, mid-swap
        main(["index", "update", str(out), "--no-progress"])
    monkeypatch.setattr(io, "crash_hook", None)
    assert sorted(it["rel"] for it in vlmatch.Index.open(out).items) == NAMES
    capsys.readouterr()
    assert main(["index", "update", str(out), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out) == {"kept": 5, "new": 2, "changed": 0, "deleted": 1}
    jpegs(imgs, ["new2.jpg", "new3.jpg"], seed=4)
    assert main(["index", "update", str(out), "--no-progress"]) == 0
    idx = vlmatch.Index.open(out)
    ids = {it["rel"]: it["id"] for it in idx.items}
    assert len(set(ids.values())) == len(ids) == 9
    assert [ids[f"new{i}.jpg"] for i in range(4)] == [6, 7, 8, 9] and idx.manifest["next_id"] == 10
    assert build(ckpts, imgs, tmp_path / "ref") == 0
    assert exhaustive(out) == exhaustive(tmp_path / "ref")


@pytest.mark.slow  # a build in a process of its own
def test_a_second_writer_is_refused_while_a_build_holds_the_folder(ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    out, gate = tmp_path / "idx", tmp_path / "gate"
    first = child(build_args(ckpts["a"], imgs, out, retriever=ckpts["vsepp"]), gate=gate)
    try:
        waiting, t0 = gate.with_name("gate.waiting"), time.monotonic()
        while not waiting.exists() and first.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.02)  # until the child holds the lock and is encoding its first batch
        assert waiting.exists(), first.communicate()[1]
        assert build(ckpts, imgs, out, model="b") == 2
        err = capsys.readouterr().err.strip()
        assert f"is being written by process {first.pid} (vlmatch index build)" in err and len(err.splitlines()) == 1
    finally:
        gate.touch()
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert build(ckpts, imgs, tmp_path / "ref") == 0  # model a's index, untouched by the refused writer
    assert exhaustive(out) == exhaustive(tmp_path / "ref")
    assert build(ckpts, imgs, out, model="b") == 0  # the lock went with its holder


def test_a_reader_that_loses_a_race_with_a_commit_opens_the_committed_index(ckpts, tmp_path, monkeypatch):
    """A reader that cannot take the read lock (a folder it may only read) tries again when a commit
    came while it opened (with the lock it waits instead: see test_index_readers)."""
    from contextlib import nullcontext

    monkeypatch.setattr(index_module, "reading", lambda path: nullcontext())

    imgs = jpegs(tmp_path / "imgs", NAMES)
    out = tmp_path / "idx"
    assert build(ckpts, imgs, out) == 0 and build(ckpts, imgs, tmp_path / "ref_b", model="b") == 0
    ref_b = exhaustive(tmp_path / "ref_b")

    monkeypatch.setattr(io, "crash_hook", lambda s: _raise(Killed) if s == "commit:parts" else None)
    with pytest.raises(Killed):  # b's parts in place, a's kept as .prev under a's manifest
        build(ckpts, imgs, out, model="b")
    monkeypatch.setattr(io, "crash_hook", None)
    real, calls = index_module.open_parts, []

    def open_parts_then_a_commit(path):
        found = real(path)
        calls.append(found[1]["model"].name)
        if len(calls) == 1:  # a writer finishes b while the reader holds a's records: a's versions go
            assert build(ckpts, imgs, out, model="b") == 0
        return found

    monkeypatch.setattr(index_module, "open_parts", open_parts_then_a_commit)
    assert exhaustive(out) == ref_b
    assert calls == ["model.prev", "model"]  # the first try lost its files; the second opened b's index


def test_a_photo_changed_while_it_is_encoded_is_encoded_again_by_the_next_update(ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    encoded = (imgs / "im1.jpg").read_bytes()

    def change_im1():  # the first batch (im0, im1) was read: im1 changes before it is encoded
        Tiny32.before_batch = None
        jpegs(imgs, ["im1.jpg"], seed=7)

    Tiny32.before_batch = change_im1
    assert build(ckpts, imgs, tmp_path / "idx") == 0
    row = {it["rel"]: it for it in vlmatch.Index.open(tmp_path / "idx").items}["im1.jpg"]
    assert row["sha256"] == hashlib.sha256(encoded).hexdigest() and row["size"] == len(encoded)
    Tiny32.images = 0
    capsys.readouterr()
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out) == {"kept": 5, "new": 0, "changed": 1, "deleted": 0}
    assert Tiny32.images == 1
    assert build(ckpts, imgs, tmp_path / "ref") == 0
    assert exhaustive(tmp_path / "idx") == exhaustive(tmp_path / "ref")


# --- 2. parts swapped or edited after the build -----------------------------------------------------

@pytest.fixture(scope="module")
def sealed(ckpts, tmp_path_factory):
    """An index of model a, and one of model b of the same photos (a source of foreign parts)."""
    root = tmp_path_factory.mktemp("sealed")
    imgs = jpegs(root / "imgs", NAMES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(backbones.BACKBONES, "tiny32", Tiny32)
        assert build(ckpts, imgs, root / "a") == 0
        assert build(ckpts, imgs, root / "b", model="b") == 0
    return root


def _edit_manifest(key, value):
    def edit(idx, sources):
        m = json.loads((idx / "manifest.json").read_text())
        *path, last = key.split(".")
        d = m
        for k in path:
            d = d[k]
        d[last] = value
        (idx / "manifest.json").write_text(json.dumps(m, indent=2))
    return edit


def _swap(part, source):
    def swap(idx, sources):
        shutil.rmtree(idx / part)
        shutil.copytree(sources[source], idx / part)
    return swap


def _foreign_faiss(idx, sources):
    v = np.load(idx / "images/stage1.npy")
    index = faiss.IndexFlatIP(v.shape[1])
    index.add(np.random.default_rng(0).standard_normal(v.shape).astype(np.float32))
    faiss.write_index(index, str(idx / "images/stage1.faiss"))


def _fewer_regions(idx, sources):  # not hashed (too large at every start): its shape is checked
    regions = np.load(idx / "images/enc/regions.npy")
    np.save(idx / "images/enc/regions.npy", regions[:, :2].copy())


def _shuffled_stage1(idx, sources):
    v = np.load(idx / "images/stage1.npy")
    np.save(idx / "images/stage1.npy", v[::-1].copy())


@pytest.mark.parametrize("tamper, found", [
    (_swap("model", "scan_b"), r"model: not the checkpoint this index was built with"),
    (_swap("retriever", "vsepp_b"), r"retriever: not the checkpoint"),
    (_swap("images/enc", "enc_b"), r"images/enc/fields.json: content does not match"),
    (_foreign_faiss, r"images/stage1.faiss: content does not match the SHA-256 recorded in manifest.json"),
    (_shuffled_stage1, r"images/stage1.npy: content does not match"),
    (_fewer_regions, r"images/enc/regions.npy: float16 \[2, 32\] per row, but fields.json records float16 \[4, 32\]"),
    (_edit_manifest("model.sha256", "0" * 64), "manifest.json: edited after the index was written"),
    (_edit_manifest("dims.stage1", 16), "manifest.json: edited"),
    (_edit_manifest("backbone.name", "efficientnet-lite0"), "manifest.json: edited"),
    (_edit_manifest("counts.images", 5), "manifest.json: edited"),
    (_edit_manifest("dtype", "float32"), "manifest.json: edited"),
    (_edit_manifest("format", 1), "manifest.json: an index of format 1"),
], ids=["model", "retriever", "encodings", "faiss", "stage1", "regions", "sha", "dims", "backbone", "counts", "dtype",
        "format"])
def test_parts_swapped_or_a_manifest_edited_are_refused(sealed, ckpts, tmp_path, capsys, tamper, found):
    idx = shutil.copytree(sealed / "a", tmp_path / "idx")
    tamper(idx, {"scan_b": ckpts["b"], "vsepp_b": ckpts["vsepp_b"], "enc_b": sealed / "b/images/enc"})
    with pytest.raises(DataError, match=found):
        vlmatch.Index.open(idx)
    assert main(["search", str(idx), "a red dog"]) == 2
    assert re.search(found, capsys.readouterr().err)
    assert main(["index", "update", str(idx), "--no-progress"]) == 2  # nothing is built on a damaged index


def test_non_finite_stored_encodings_are_refused_not_ranked(sealed, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from vlmatch.search.service import IndexBackend, create_app

    idx = shutil.copytree(sealed / "a", tmp_path / "idx")
    enc = np.load(idx / "images/enc/regions.npy", mmap_mode="r+")
    enc[2, 0, 0] = np.nan
    enc.flush()
    del enc
    index = vlmatch.Index.open(idx)  # the shapes are checked; a row is checked when it is read
    with pytest.raises(DataError, match=r"images/enc/regions.npy: NaN or inf in stored row\(s\) \[2\]"):
        index.search("a red dog", k=3, candidates=6)
    assert main(["search", str(idx), "a red dog", "--candidates", "6"]) == 2
    assert "NaN or inf in stored row" in capsys.readouterr().err
    with TestClient(create_app(IndexBackend(index))) as c:
        r = c.post("/search", json={"text": "a red dog", "k": 3, "candidates": 6})
    # a damaged index is the server's fault, not the client's: 500, and no internal text (no path, no "NaN")
    assert r.status_code == 500 and "regions.npy" not in r.text and r.json()["detail"].startswith("the server failed")


def test_a_model_that_gives_nan_is_refused_at_build(ckpts, tmp_path, capsys, monkeypatch):
    real = Tiny32.feature_map
    monkeypatch.setattr(Tiny32, "feature_map", lambda self, x: real(self, x) * float("nan"))
    assert build(ckpts, jpegs(tmp_path / "imgs", NAMES), tmp_path / "idx") == 2
    assert "the model gave NaN or inf stage-1 vectors for im0.jpg .. im1.jpg" in capsys.readouterr().err


# --- 3. an update whose new files are all unreadable ----------------------------------------------

def test_update_skip_bad_with_only_unreadable_new_files_still_drops_deleted_ones(ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", NAMES)
    assert build(ckpts, imgs, tmp_path / "idx") == 0
    (imgs / "bad.jpg").write_bytes(b"not a jpeg")
    (imgs / "im0.jpg").unlink()
    capsys.readouterr()
    assert main(["index", "update", str(tmp_path / "idx"), "--skip-bad", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("skipped bad.jpg: ")
    assert json.loads(out[-1]) == {"kept": 5, "new": 1, "changed": 0, "deleted": 1}
    idx = vlmatch.Index.open(tmp_path / "idx")
    assert sorted(it["rel"] for it in idx.items) == NAMES[1:]
    assert [s["key"] for s in idx.manifest["skipped"]] == ["bad.jpg"]
    # nothing deleted, only an unreadable new file: the collection stands, the manifest names the file
    (imgs / "bad2.jpg").write_bytes(b"neither")
    files_before = files(tmp_path / "idx" / "images")
    assert main(["index", "update", str(tmp_path / "idx"), "--skip-bad", "--no-progress"]) == 0
    assert files(tmp_path / "idx" / "images") == files_before
    idx = vlmatch.Index.open(tmp_path / "idx")
    assert [s["key"] for s in idx.manifest["skipped"]] == ["bad.jpg", "bad2.jpg"] and len(idx) == 5
    # every photo gone: an error, not an empty index
    for p in imgs.glob("im*.jpg"):
        p.unlink()
    assert main(["index", "update", str(tmp_path / "idx"), "--skip-bad", "--no-progress"]) == 2
    assert "nothing left to index" in capsys.readouterr().err
