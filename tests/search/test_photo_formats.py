"""Index build, update, search and explain on photos as phones store them: EXIF-rotated JPEGs, HEIC (also
under a .jpg name or none), TIFF -- every one encoded as it is displayed (vlmatch.features.photo)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import vlmatch
from vlmatch.cli import main
from vlmatch.features import photo
from vlmatch.search.backends.folder import MANIFEST, seal

from ..features.test_photo import heic_bytes, jpeg_bytes, stored_as, upright_photo
from .tiny import Tiny32, build_args, tiny_backbone  # noqa: F401  (tiny_backbone: autouse)


def phone_folder(folder, orientations=range(1, 9)):
    """The test card upright (``upright.jpg``) and stored as each EXIF orientation (``o{N}.jpg``)."""
    folder.mkdir(parents=True, exist_ok=True)
    up = upright_photo(96, 64)
    (folder / "upright.jpg").write_bytes(jpeg_bytes(up))
    for o in orientations:
        (folder / f"o{o}.jpg").write_bytes(jpeg_bytes(stored_as(up, o), o))
    return folder


def encodings_by_rel(index_dir) -> dict[str, np.ndarray]:
    """Each indexed photo's stage-2 encoding (the model's per-region image encoding, every tensor field
    flattened): unlike a pooled stage-1 vector, it changes when the photo is turned."""
    idx = vlmatch.Index.open(index_dir)
    coll = idx.images
    enc = coll.take(np.arange(len(coll))).tensors()
    flat = np.concatenate([t.float().reshape(len(coll), -1).numpy() for _, t in sorted(enc.items())], axis=1)
    return {it["rel"]: flat[row] for row, it in enumerate(coll.items)}


def build(ckpts, images, out, *extra):
    return main(build_args(ckpts["scan"], images, out, *extra, retriever=ckpts["vsepp"]))


def test_the_eight_orientations_of_a_photo_encode_alike(toy_ckpts, tmp_path):
    imgs = phone_folder(tmp_path / "phone")
    (tmp_path / "other").mkdir()
    Image.fromarray(np.asarray(upright_photo(96, 64))[::-1, ::-1].copy()).save(imgs / "other.jpg", quality=95)
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    v = encodings_by_rel(tmp_path / "idx")
    want = v["upright.jpg"]
    for o in range(1, 9):
        assert np.abs(v[f"o{o}.jpg"] - want).max() < 0.02, o  # JPEG noise only
    assert np.abs(v["other.jpg"] - want).max() > 0.1  # the same pixels turned: another picture to the model
    assert vlmatch.Index.open(tmp_path / "idx").manifest["reader"] == photo.READER_VERSION


def peak_agreement(got: np.ndarray, want: np.ndarray) -> float:
    """The worst word's value of ``got`` at ``want``'s peak, as a share of ``got``'s own range (1: the same
    peak; maps are (regions, words))."""
    at = got[want.argmax(axis=0), np.arange(want.shape[1])]
    return float(((at - got.min(axis=0)) / (got.max(axis=0) - got.min(axis=0))).min())


def word_maps(tmp_path, name: str) -> dict[str, np.ndarray]:
    from vlmatch.search.build import build_index

    from .photo_index import save_models

    up = upright_photo(320, 224)
    imgs = tmp_path / name
    imgs.mkdir()
    (imgs / "upright.jpg").write_bytes(jpeg_bytes(up, quality=100))
    for o in (3, 6, 8):  # upside down and both portrait rotations
        (imgs / f"o{o}.jpg").write_bytes(jpeg_bytes(stored_as(up, o), o, quality=100))
    ck = save_models(tmp_path / f"ckpt_{name}")
    build_index(tmp_path / f"idx_{name}", ck["model"], images=imgs, retriever_ckpt=ck["retriever"],
                backbone="efficientnet-lite0", progress=False)
    idx = vlmatch.Index.open(tmp_path / f"idx_{name}")
    return {it["rel"]: idx.explain(it["id"], "a red ball in the park", method="occlusion").weights for it in idx.items}


@pytest.mark.slow  # seconds
def test_heat_map_peaks_fall_on_the_same_place_of_the_upright_photo(tmp_path, monkeypatch):
    """A real backbone (EfficientNet-Lite0, 7 x 7 grid) and an untrained SCAN's occlusion maps (the score drop
    with each grid cell masked): each stored orientation's maps peak where the upright photo's do, word by
    word; the reader before EXIF orientation puts them elsewhere. (An untrained SCAN's own attention is
    nearly flat and its clipped l2 norm amplifies the last bits: a near-tie can tip its peak either way.)"""
    pytest.importorskip("efficientnet_lite_pytorch")
    maps = word_maps(tmp_path, "now")
    for rel in ("o3.jpg", "o6.jpg", "o8.jpg"):
        assert maps[rel].shape == maps["upright.jpg"].shape == (49, 6)
        assert peak_agreement(maps[rel], maps["upright.jpg"]) > 0.99, rel
    monkeypatch.setattr(photo, "upright", lambda im, orientation: im)  # the stored pixels, as before
    sideways = word_maps(tmp_path, "before")
    assert max(peak_agreement(sideways[rel], sideways["upright.jpg"]) for rel in ("o3.jpg", "o6.jpg", "o8.jpg")) < 0.9


def test_heic_tiff_and_unsuffixed_photos_index_and_search(toy_ckpts, tmp_path, capsys):
    imgs = phone_folder(tmp_path / "phone", orientations=(6,))
    up = upright_photo(96, 64)
    data = heic_bytes(stored_as(up, 6), 6)
    (imgs / "iphone.HEIC").write_bytes(data)
    (imgs / "really_heic.jpg").write_bytes(data)
    (imgs / "sent_without_suffix").write_bytes(jpeg_bytes(up))
    up.save(imgs / "scan.tif")
    (imgs / "notes.txt").write_text("not a photo")
    (imgs / "clip.mov").write_bytes(b"\x00\x00\x00\x18ftypqt  " + b"\x00" * 64)
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    v = encodings_by_rel(tmp_path / "idx")
    assert sorted(v) == ["iphone.HEIC", "o6.jpg", "really_heic.jpg", "scan.tif", "sent_without_suffix", "upright.jpg"]
    for rel in v:
        assert np.abs(v[rel] - v["upright.jpg"]).max() < 0.03, rel
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a red dog", "-k", "6", "--json", str(tmp_path / "r.json")]) == 0
    found = {r["path"].rsplit("/", 1)[-1] for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert {"iphone.HEIC", "really_heic.jpg"} <= found


def test_a_heic_without_its_decoder_stops_the_build_naming_the_extra(toy_ckpts, tmp_path, capsys, monkeypatch):
    imgs = phone_folder(tmp_path / "phone", orientations=())
    (imgs / "iphone.heic").write_bytes(heic_bytes(upright_photo()))
    monkeypatch.setattr(photo, "decoder_available", lambda fmt: fmt not in ("HEIF", "AVIF"))
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "iphone.heic" in err and "pip install 'vlmatch[vision]'" in err
    assert build(toy_ckpts, imgs, tmp_path / "idx", "--skip-bad") == 0  # never a silent skip: listed as skipped
    assert "skipped iphone.heic: a HEIF photo, and no HEIF decoder is installed" in capsys.readouterr().out


def test_update_turns_upright_what_an_older_reader_indexed_sideways(toy_ckpts, tmp_path, capsys, monkeypatch):
    imgs = phone_folder(tmp_path / "phone", orientations=(1, 3, 6, 8))
    with monkeypatch.context() as m:  # the reader before EXIF orientation: stored pixels, manifest without "reader"
        m.setattr(photo, "upright", lambda im, orientation: im)
        assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    mpath = tmp_path / "idx" / MANIFEST
    manifest = json.loads(mpath.read_text())
    del manifest["reader"]
    manifest["seal"] = seal(manifest)
    mpath.write_text(json.dumps(manifest))
    old = encodings_by_rel(tmp_path / "idx")
    assert np.abs(old["o6.jpg"] - old["upright.jpg"]).max() > 0.1  # indexed sideways
    Tiny32.images = 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a red dog"]) == 0
    assert "ignored EXIF orientation" in capsys.readouterr().err  # one line says what to do
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep == {"kept": 2, "new": 0, "changed": 0, "reoriented": 3, "deleted": 0}
    assert Tiny32.images == 3  # only the three rotated photos were read again
    new = encodings_by_rel(tmp_path / "idx")
    for rel in ("o3.jpg", "o6.jpg", "o8.jpg"):
        assert np.abs(new[rel] - new["upright.jpg"]).max() < 0.02, rel
    assert vlmatch.Index.open(tmp_path / "idx").manifest["reader"] == photo.READER_VERSION
    assert main(["index", "update", str(tmp_path / "idx"), "--no-progress"]) == 0  # now current: nothing to do
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"kept": 5, "new": 0, "changed": 0,
                                                                           "deleted": 0}
    assert main(["search", str(tmp_path / "idx"), "a red dog"]) == 0
    assert "EXIF" not in capsys.readouterr().err


@pytest.mark.slow  # a Milvus Lite build
def test_a_milvus_update_turns_upright_what_an_older_reader_indexed_sideways(toy_ckpts, tmp_path, monkeypatch):
    pytest.importorskip("milvus_lite")
    from vlmatch.search.backends.base import MilvusLocation
    from vlmatch.search.backends.milvus.client import MANIFEST, connect, write_prop
    from vlmatch.search.backends.milvus.collection import read_manifest
    from vlmatch.search.build import build_index, update_index

    imgs = phone_folder(tmp_path / "phone", orientations=(1, 6))
    loc = MilvusLocation(str(tmp_path / "m.db"), "phone")
    with monkeypatch.context() as m:  # the reader before EXIF orientation, and a manifest without "reader"
        m.setattr(photo, "upright", lambda im, orientation: im)
        build_index(loc, toy_ckpts["scan"], images=imgs, retriever_ckpt=toy_ckpts["vsepp"], backbone="tiny32",
                     progress=False, batch_size=2)
    client = connect(loc.uri)
    manifest = read_manifest(client, loc)
    del manifest["reader"]
    manifest["seal"] = seal(manifest)
    write_prop(client, loc.collection, MANIFEST, manifest)
    client.close()

    def encodings():
        idx = vlmatch.Index.open(milvus_uri=loc.uri, collection=loc.collection)
        ids = {it["rel"]: it["id"] for it in idx.items}
        return {rel: idx.images.take(np.array([i])).tensors() for rel, i in ids.items()}

    def gap(enc, a, b):
        return max(float((enc[a][f].float() - enc[b][f].float()).abs().max()) for f in enc[a] if enc[a][f].is_floating_point())

    assert gap(encodings(), "o6.jpg", "upright.jpg") > 0.1  # indexed sideways
    rep = update_index(loc, progress=False, batch_size=2)
    assert rep == {"kept": 2, "new": 0, "changed": 0, "reoriented": 1, "deleted": 0, "skipped": []}
    assert gap(encodings(), "o6.jpg", "upright.jpg") < 0.02
    assert update_index(loc, progress=False) == {"kept": 3, "new": 0, "changed": 0, "deleted": 0, "skipped": []}
