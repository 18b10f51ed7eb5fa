"""Index build from a folder of JPEGs: backbone checks, bad images, update, resume, shards."""

import json
import shutil

import numpy as np
import pytest

import vlmatch
from vlmatch.checkpoints.seal import seal_checkpoint
from vlmatch.cli import main
from vlmatch.errors import VlmatchError
from vlmatch.search import build as B

from .tiny import Tiny32, build_args, exhaustive, jpegs, tiny_backbone  # noqa: F401  (tiny_backbone: autouse)


def build(ckpts, images, out, *extra):
    return main(build_args(ckpts["scan"], images, out, *extra, retriever=ckpts["vsepp"]))


@pytest.mark.slow  # seconds
def test_folder_build_bad_images_and_backbone_checks(toy_ckpts, tmp_path, capsys):
    names = [f"im{i}.jpg" for i in range(5)] + ["sub/im5.jpg"]
    imgs = jpegs(tmp_path / "imgs", names)
    (imgs / "broken.jpg").write_bytes(b"not a jpeg")
    assert build(toy_ckpts, imgs, tmp_path / "a") == 2
    err = capsys.readouterr().err.strip()
    assert "broken.jpg" in err and "--skip-bad" in err and len(err.splitlines()) == 1
    assert build(toy_ckpts, imgs, tmp_path / "a", "--skip-bad") == 0
    assert "skipped broken.jpg" in capsys.readouterr().out
    idx = vlmatch.Index.open(tmp_path / "a")
    assert sorted(it["rel"] for it in idx.items) == sorted(names)
    assert idx.manifest["backbone"]["name"] == "tiny32" and idx.manifest["counts"]["images"] == 6
    assert idx.path_of(idx.items[0]["id"]) == str((imgs / idx.items[0]["rel"]).resolve())
    # no backbone recorded for a toy-world model: it must be named
    assert main(["index", "build", "--model", str(toy_ckpts["scan"]), "--retriever", str(toy_ckpts["vsepp"]),
                 "--images", str(imgs), "--out", str(tmp_path / "b")]) == 2
    assert "--backbone" in capsys.readouterr().err
    # a checkpoint that records another backbone refuses these features
    ck = shutil.copytree(toy_ckpts["scan"], tmp_path / "ck")
    (ck / "backbone.json").write_text(json.dumps({"name": "efficientnet-lite0", "grid": 7, "dim": 1280}))
    seal_checkpoint(ck)
    assert main(["index", "build", "--model", str(ck), "--retriever", str(toy_ckpts["vsepp"]), "--images",
                 str(imgs), "--out", str(tmp_path / "c"), "--backbone", "tiny32"]) == 2
    assert "trained on efficientnet-lite0" in capsys.readouterr().err


def test_update_encodes_only_new_and_changed_files(toy_ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", [f"im{i}.jpg" for i in range(6)])
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    before = {it["rel"]: it["id"] for it in vlmatch.Index.open(tmp_path / "idx").items}
    jpegs(imgs, ["new0.jpg", "new1.jpg"], seed=5)
    jpegs(imgs, ["im2.jpg"], seed=9)  # changed content
    (imgs / "im4.jpg").unlink()
    (imgs / "im1.jpg").touch()  # a new mtime, same bytes: not re-encoded
    Tiny32.images = 0
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep == {"kept": 4, "new": 2, "changed": 1, "deleted": 1}
    assert Tiny32.images == 3
    idx = vlmatch.Index.open(tmp_path / "idx")
    after = {it["rel"]: it["id"] for it in idx.items}
    assert "im4.jpg" not in after and all(after[r] == before[r] for r in before if r != "im4.jpg")
    assert after["new0.jpg"] >= 6 and after["new1.jpg"] >= 6
    assert build(toy_ckpts, imgs, tmp_path / "fresh") == 0  # a fresh build gives the same scores
    a, b = exhaustive(tmp_path / "idx"), exhaustive(tmp_path / "fresh")
    assert a.keys() == b.keys() and all(abs(a[p] - b[p]) < 1e-6 for p in a)
    capsys.readouterr()
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["kept"] == 7


def test_an_interrupted_build_resumes_where_it_stopped(toy_ckpts, tmp_path):
    imgs = jpegs(tmp_path / "imgs", [f"im{i}.jpg" for i in range(7)])
    Tiny32.fail_after = 4
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 130  # the CLI reports the interruption (Ctrl-C)
    with pytest.raises(VlmatchError, match="interrupted"):
        vlmatch.Index.open(tmp_path / "idx")
    Tiny32.fail_after, Tiny32.images = None, 0
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    assert Tiny32.images == 3  # the first two batches of two were kept
    assert not (tmp_path / "idx" / "build").exists()
    assert build(toy_ckpts, imgs, tmp_path / "ref") == 0
    a, b = exhaustive(tmp_path / "idx"), exhaustive(tmp_path / "ref")
    assert a == b


def test_shards_merge_to_the_single_process_result(toy_ckpts, tmp_path):
    from vlmatch.search.encode import Stage1Source
    from vlmatch.search.inputs import image_batches
    from vlmatch.search.job import Part, image_encoder, load_index_model
    from vlmatch.search.scan import scan_folder

    imgs = jpegs(tmp_path / "imgs", [f"im{i}.jpg" for i in range(7)])
    scan, _ = load_index_model(toy_ckpts["scan"])
    vse, _ = load_index_model(toy_ckpts["vsepp"])
    rels = scan_folder(imgs)
    part = Part("images", rels, image_batches(imgs, Tiny32(), batch_size=2, skip_bad=False),
                image_encoder(scan, Stage1Source(scan, vse)), row_of=None, what=())

    one = B.encode_sharded(tmp_path / "w1", part, "fp", "float32")
    assert B.encode_sharded(tmp_path / "w2", part, "fp", "float32", rank=1, world=2) is None
    two = B.encode_sharded(tmp_path / "w2", part, "fp", "float32", rank=0, world=2)
    assert one["keys"] == two["keys"] == rels
    np.testing.assert_allclose(np.load(two["folder"] / "stage1.npy"), np.load(one["folder"] / "stage1.npy"), atol=1e-6)
    np.testing.assert_allclose(np.load(two["folder"] / "enc/regions.npy"), np.load(one["folder"] / "enc/regions.npy"),
                               atol=1e-6)


@pytest.mark.slow  # seconds
def test_explain_cli_writes_png_and_json(toy_ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", ["a.jpg"])
    out = tmp_path / "heat.png"
    assert main(["explain", "--model", str(toy_ckpts["scan"]), "--image", str(imgs / "a.jpg"), "--text",
                 "a red dog near a blue car", "--out", str(out), "--json", str(tmp_path / "h.json"),
                 "--backbone", "tiny32", "--method", "attention"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    j = json.loads((tmp_path / "h.json").read_text())
    w = np.array(j["weights"])
    assert j["words"][1:4] == ["a", "red", "dog"] and w.shape == (4, len(j["words"])) and j["grid"] == 2
    np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=1e-5)  # SCAN t-i: each word over the 4 positions


def test_a_recalibrated_checkpoint_does_not_resume_an_interrupted_build(toy_ckpts, tmp_path):
    """The resume fingerprint covers the whole checkpoint (its checksums.json), not only model.safetensors:
    a build interrupted with one calibration starts over with another, never mixing their offsets."""
    import torch

    from vlmatch.models.calibration import Calibration
    from vlmatch.weights import sha256_file

    imgs = jpegs(tmp_path / "imgs", [f"im{i}.jpg" for i in range(7)])
    vse = vlmatch.load_model(toy_ckpts["vsepp"])
    bank = torch.nn.functional.normalize(torch.randn(12, vse.cfg.embed_dim, generator=torch.Generator().manual_seed(1)),
                                         dim=1)
    vse.calibration = Calibration.fit(20.0, rank=8, text=bank)
    vse.save(tmp_path / "ret")
    ckpts = {"scan": toy_ckpts["scan"], "vsepp": tmp_path / "ret"}
    Tiny32.fail_after = 4
    assert build(ckpts, imgs, tmp_path / "idx") == 130
    vse.calibration = Calibration.fit(3.0, rank=8, text=bank)  # recalibrated: same weights, other beta
    vse.save(tmp_path / "ret")
    assert sha256_file(tmp_path / "ret" / "model.safetensors") == sha256_file(toy_ckpts["vsepp"] / "model.safetensors")
    Tiny32.fail_after, Tiny32.images = None, 0
    assert build(ckpts, imgs, tmp_path / "idx") == 0
    assert Tiny32.images == 7  # started over: nothing encoded with the first calibration was kept
    assert build(ckpts, imgs, tmp_path / "ref") == 0
    assert exhaustive(tmp_path / "idx") == exhaustive(tmp_path / "ref")


@pytest.mark.slow  # two builds, each in a process of its own
def test_a_jpeg_claiming_more_pixels_than_its_data_is_refused_by_the_build(toy_ckpts, tmp_path):
    """A JPEG whose header claims 65,000 x 65,000 over 500 x 375 of data (and a DNG whose preview claims more than
    its data) was indexed as 8,125² of grey with the claimed size recorded: `index build`, in its own process,
    stops with one line naming the file, or with --skip-bad lists it skipped and indexes the rest."""
    from ..features.raw_files import tiff_raw
    from ..features.test_jpeg_data import claiming, photo_bytes
    from .tiny import run_child

    imgs = jpegs(tmp_path / "imgs", ["a.jpg", "b.jpg"])
    (imgs / "claims.jpg").write_bytes(claiming(photo_bytes(), 65000, 65000))
    (imgs / "IMG_2.DNG").write_bytes(tiff_raw(claiming(photo_bytes(), 1000, 800), how="strip"))
    args = build_args(toy_ckpts["scan"], imgs, tmp_path / "idx", retriever=toy_ckpts["vsepp"])
    stopped = run_child(args)
    err = stopped.stderr.strip()
    assert stopped.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "claims" in err and ("claims.jpg" in err or "IMG_2.DNG" in err)
    skipped = run_child([*args, "--skip-bad"])
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped claims.jpg" in skipped.stdout and "skipped IMG_2.DNG" in skipped.stdout
    idx = vlmatch.Index.open(tmp_path / "idx")
    assert sorted(it["rel"] for it in idx.items) == ["a.jpg", "b.jpg"]
    reasons = {s["key"]: s["error"] for s in idx.manifest["skipped"]}
    assert "claims 65000x65000 pixels" in reasons["claims.jpg"] and "claims 1000x800 pixels" in reasons["IMG_2.DNG"]
