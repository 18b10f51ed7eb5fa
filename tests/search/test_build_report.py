"""What `index build` says: found by kind, indexed, skipped with reasons, time and rate; a second build of
the same folder with the same model says what `index update` would do instead of encoding it all again;
RAW files are paired with their JPEG or read through their preview."""

import io
import shutil

import pytest

import vlmatch

from ..features.raw_files import jpeg_bytes, tiff_raw
from .test_build_images import build
from .tiny import jpegs, tiny_backbone  # noqa: F401  (tiny_backbone: autouse)


def mixed_library(folder):
    from PIL import Image

    jpegs(folder, ["a.jpg", "b.jpg", "IMG_1.JPG"])
    Image.new("RGB", (40, 30), (0, 90, 200)).save(folder / "c.png")
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 90, 0)).save(buf, "TIFF")
    (folder / "d.tif").write_bytes(buf.getvalue())
    (folder / "IMG_1.CR2").write_bytes(tiff_raw(jpeg_bytes(), canon=True))  # RAW + JPEG: one photo
    (folder / "alone.nef").write_bytes(tiff_raw(jpeg_bytes((80, 60))))  # read through its preview
    (folder / "bare.dng").write_bytes(tiff_raw(None))  # no preview: skipped, with or without --skip-bad
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return folder


@pytest.mark.slow  # seconds
def test_the_build_reports_kinds_skips_and_rate_and_pairs_raws(toy_ckpts, tmp_path, capsys):
    imgs = mixed_library(tmp_path / "imgs")
    assert build(toy_ckpts, imgs, tmp_path / "idx", "--skip-bad") == 0
    out = capsys.readouterr().out
    assert "found 9 files: 4 JPEG, 1 PNG, 1 TIFF, 3 RAW; 1 RAW indexed as the JPEG of the same shot" in out
    assert "indexed 6 photos: 6 encoded in " in out and " photos/s)" in out
    assert "skipped 2: 1 a camera RAW with no embedded JPEG preview; 1 unreadable image" in out
    assert "  skipped bare.dng: a camera RAW with no embedded JPEG preview" in out
    m = vlmatch.Index.open(tmp_path / "idx").manifest
    assert m["found"] == {"JPEG": 4, "HEIC": 0, "PNG": 1, "TIFF": 1, "RAW": 3, "other": 0}
    assert m["raw_pairs"] == [{"raw": "IMG_1.CR2", "jpeg": "IMG_1.JPG"}]
    assert sorted(s["key"] for s in m["skipped"]) == ["bare.dng", "broken.jpg"]
    assert m["build"]["encoded"] == 6 and m["build"]["photos_per_s"] > 0
    rels = sorted(it["rel"] for it in vlmatch.Index.open(tmp_path / "idx").items)
    assert rels == ["IMG_1.JPG", "a.jpg", "alone.nef", "b.jpg", "c.png", "d.tif"]


def test_a_raw_without_preview_does_not_stop_a_build(toy_ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", ["a.jpg", "b.jpg"])
    (imgs / "bare.dng").write_bytes(tiff_raw(None))
    assert build(toy_ckpts, imgs, tmp_path / "idx") == 0
    assert "skipped bare.dng: a camera RAW with no embedded JPEG preview" in capsys.readouterr().out


def test_a_second_build_says_what_update_would_do_and_rebuild_proceeds(toy_ckpts, tmp_path, capsys):
    imgs = jpegs(tmp_path / "imgs", [f"im{i}.jpg" for i in range(5)])
    out = tmp_path / "idx"
    assert build(toy_ckpts, imgs, out) == 0
    jpegs(imgs, ["new.jpg"], seed=3)
    (imgs / "im0.jpg").unlink()
    capsys.readouterr()
    before = (out / "manifest.json").read_bytes()
    assert build(toy_ckpts, imgs, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (f"already indexes this photo folder with this model: `vlmatch index update {out}` would encode 1 new, "
            "0 changed photos and drop 1 removed (4 kept as they are); pass --rebuild to encode all 5 photos again"
            ) in err
    assert (out / "manifest.json").read_bytes() == before  # nothing written
    assert build(toy_ckpts, imgs, out, "--rebuild") == 0
    assert len(vlmatch.Index.open(out)) == 5
    # another photo folder, or another model: a rebuild, said by the report as any build
    other = shutil.copytree(imgs, tmp_path / "other")
    assert build(toy_ckpts, other, out) == 0
    assert "indexed 5 photos: 5 encoded in " in capsys.readouterr().out
    assert vlmatch.Index.open(out).manifest["source"]["root"] == str(other.resolve())


def test_photos_decoded_in_worker_processes_index_the_same(toy_ckpts, tmp_path, capsys, monkeypatch):
    imgs = mixed_library(tmp_path / "imgs")
    assert build(toy_ckpts, imgs, tmp_path / "thread", "--skip-bad") == 0
    monkeypatch.setenv("VLMATCH_DECODE_WORKERS", "2")
    assert build(toy_ckpts, imgs, tmp_path / "procs", "--skip-bad") == 0
    a, b = vlmatch.Index.open(tmp_path / "thread"), vlmatch.Index.open(tmp_path / "procs")
    assert [it["rel"] for it in a.items] == [it["rel"] for it in b.items]
    assert [it["sha256"] for it in a.items] == [it["sha256"] for it in b.items]
    import numpy as np

    assert np.allclose(np.asarray(a.images.stage1.vectors), np.asarray(b.images.stage1.vectors), atol=1e-5)
    assert a.manifest["skipped"] == b.manifest["skipped"]
    capsys.readouterr()
    assert build(toy_ckpts, imgs, tmp_path / "stops") == 2  # without --skip-bad: one line naming the file
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.jpg" in err and "--skip-bad" in err and "Traceback" not in err


def test_a_raws_row_records_the_pixels_it_shows(tmp_path):
    """An index row's ``pixels`` of a RAW read through its preview: the preview's size as displayed."""
    from vlmatch.search.inputs import photo_row

    data = tiff_raw(jpeg_bytes((96, 64)), orientation=6, canon=True)
    assert photo_row(data, tmp_path / "IMG_2.CR2")["pixels"] == [64, 96]
    assert photo_row(jpeg_bytes((96, 64)), tmp_path / "plain.jpg")["pixels"] == [96, 64]
