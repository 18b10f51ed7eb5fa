"""Feature extraction on generated images: layout, resume, bad input, Karpathy JSON."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vlmatch.data.karpathy import read_karpathy
from vlmatch.data.precomp import PrecompSplit
from vlmatch.errors import DataError
from vlmatch.features.backbones import Backbone, BackboneInfo, create_backbone
from vlmatch.features.extract import extract
from vlmatch.features.photo import load_image


class TinyBackbone(Backbone):
    """A deterministic stand-in: 2x2 grid of 3-d features (the mean colour of each quadrant)."""

    def __init__(self, fail_after=None):
        super().__init__()
        self.info = BackboneInfo("tiny", 8, 2, 3, "pixel / 255")
        self.calls, self.fail_after = 0, fail_after

    def _normalise(self, x):
        return x / 255.0

    def feature_map(self, x):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        return torch.nn.functional.avg_pool2d(x, 4)


def make_images(folder, n, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    for i in range(n):
        name = f"img{i:03d}.jpg"
        Image.fromarray(rng.integers(0, 255, (20, 16, 3), dtype=np.uint8)).save(folder / name)
        names.append(name)
    return names


def make_karpathy(path, names, splits):
    images = [{"filename": n, "split": s, "imgid": i,
               "sentences": [{"raw": f"A photo number {i} variant {c}.", "tokens": []} for c in range(5)]}
              for i, (n, s) in enumerate(zip(names, splits, strict=True))]
    path.write_text(json.dumps({"dataset": "flickr8k", "images": images}))
    return path


def test_annotated_extraction_writes_loadable_precomp(tmp_path):
    names = make_images(tmp_path / "im", 7)
    ann = make_karpathy(tmp_path / "d.json", names, ["train", "train", "restval", "val", "val", "test", "train"])
    rep = extract(tmp_path / "im", tmp_path / "out", ann, TinyBackbone(), batch_size=2, progress=False,
                  global_features=True)
    tr = PrecompSplit(tmp_path / "out", "train")
    assert tr.features.shape == (4, 4, 3) and len(tr.captions) == 20  # restval joins train
    assert tr.ids == ["img000.jpg", "img001.jpg", "img002.jpg", "img006.jpg"]
    assert PrecompSplit(tmp_path / "out", "dev").n_images == 2 and PrecompSplit(tmp_path / "out", "test").n_images == 1
    g = np.load(tmp_path / "out" / "train_global.npy")
    np.testing.assert_allclose(g, np.asarray(tr.features).mean(axis=1), rtol=1e-6)
    meta = json.loads((tmp_path / "out" / "features.json").read_text())
    assert meta["backbone"]["grid"] == 2 and meta["dtype"] == "float32" and rep["splits"]["train"]["images"] == 4


def test_gallery_mode_and_float16(tmp_path):
    make_images(tmp_path / "im", 3)
    (tmp_path / "im" / "notes.txt").write_text("not an image")
    extract(tmp_path / "im", tmp_path / "g", None, TinyBackbone(), dtype="float16", progress=False)
    arr = np.load(tmp_path / "g" / "ims.npy")
    assert arr.shape == (3, 4, 3) and arr.dtype == np.float16
    assert (tmp_path / "g" / "ids.txt").read_text().split() == ["img000.jpg", "img001.jpg", "img002.jpg"]


def test_interrupted_extraction_resumes_where_it_stopped(tmp_path):
    make_images(tmp_path / "im", 9)
    extract(tmp_path / "im", tmp_path / "ref", None, TinyBackbone(), batch_size=2, progress=False)
    with pytest.raises(KeyboardInterrupt):
        extract(tmp_path / "im", tmp_path / "cut", None, TinyBackbone(fail_after=2), batch_size=2, progress=False)
    assert not (tmp_path / "cut" / "ims.npy").exists()  # nothing half-written under the final name
    bb = TinyBackbone()
    rep = extract(tmp_path / "im", tmp_path / "cut", None, bb, batch_size=2, progress=False)
    assert rep["splits"]["gallery"]["resumed_from"] == 4 and bb.calls == 3  # 5 images left, 3 batches
    np.testing.assert_array_equal(np.load(tmp_path / "cut" / "ims.npy"), np.load(tmp_path / "ref" / "ims.npy"))


def test_corrupt_image_stops_with_its_name_or_is_skipped(tmp_path):
    names = make_images(tmp_path / "im", 4)
    (tmp_path / "im" / names[2]).write_bytes(b"\xff\xd8 truncated jpeg")
    ann = make_karpathy(tmp_path / "d.json", names, ["train"] * 4)
    with pytest.raises(DataError, match=r"img002\.jpg: unreadable image"):
        extract(tmp_path / "im", tmp_path / "o1", ann, TinyBackbone(), progress=False)
    rep = extract(tmp_path / "im", tmp_path / "o2", ann, TinyBackbone(), skip_bad=True, progress=False)
    assert [s["image"] for s in rep["splits"]["train"]["skipped"]] == ["img002.jpg"]
    sp = PrecompSplit(tmp_path / "o2", "train")
    assert sp.n_images == 3 and len(sp.captions) == 15
    assert sp.ids == ["img000.jpg", "img001.jpg", "img003.jpg"]
    assert "number 3" in sp.captions[10]  # captions dropped consistently with their image


def test_missing_image_in_annotations_is_named(tmp_path):
    names = make_images(tmp_path / "im", 2)
    ann = make_karpathy(tmp_path / "d.json", names + ["ghost.jpg"], ["train"] * 3)
    with pytest.raises(DataError, match=r"ghost\.jpg: image listed in .*d\.json not found"):
        extract(tmp_path / "im", tmp_path / "o", ann, TinyBackbone(), progress=False)


def test_karpathy_reader_errors_and_coco_paths(tmp_path):
    p = tmp_path / "coco.json"
    p.write_text(json.dumps({"images": [{"filepath": "val2014", "filename": "a.jpg", "split": "restval",
                                         "sentences": [{"raw": f"cap {i}"} for i in range(6)]}]}))
    out = read_karpathy(p)
    assert out["train"][0].path == "val2014/a.jpg" and len(out["train"][0].captions) == 5
    p.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "val", "sentences": [{"raw": "x"}]}]}))
    with pytest.raises(DataError, match="has 1 non-empty captions, needs 5"):
        read_karpathy(p)
    p.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "holdout", "sentences": []}]}))
    with pytest.raises(DataError, match="unknown split 'holdout'"):
        read_karpathy(p)
    p.write_text("[1, 2")
    with pytest.raises(DataError, match=r"coco\.json: not valid JSON"):
        read_karpathy(p)


def test_efficientnet_lite0_gives_a_7x7_grid_of_1280(tmp_path):
    pytest.importorskip("efficientnet_lite_pytorch")
    make_images(tmp_path / "im", 2)
    extract(tmp_path / "im", tmp_path / "e", None, "efficientnet-lite0", progress=False)
    arr = np.load(tmp_path / "e" / "ims.npy")
    assert arr.shape == (2, 49, 1280) and np.isfinite(arr).all() and arr.std() > 0


@pytest.mark.parametrize("variant", [1, 2])
def test_the_larger_lite_backbones_load_their_weights_and_keep_the_stride(tmp_path, variant):
    lite = pytest.importorskip("efficientnet_lite_pytorch")
    torch.manual_seed(0)
    weights = tmp_path / "w.pth"  # the packaged weights are an optional extra: a random state of the same layout
    torch.save(lite.EfficientNet.from_name(f"efficientnet-lite{variant}").state_dict(), weights)
    bb = create_backbone(f"efficientnet-lite{variant}", weights=str(weights), input_size=64)
    assert bb.describe() == {"name": f"efficientnet-lite{variant}", "input_size": 64, "grid": 2, "dim": 1280,
                             "normalisation": "(pixel - 127) / 128"}
    with torch.no_grad():
        assert bb(torch.zeros(1, 3, 64, 64)).shape == (1, 4, 1280)


def test_the_cli_offers_every_backbone():
    from vlmatch.cli.features import BACKBONE_NAMES
    from vlmatch.features.backbones import BACKBONES

    assert BACKBONE_NAMES == sorted(BACKBONES)


def test_a_split_is_complete_only_once_its_ids_and_captions_are_written(tmp_path, monkeypatch):
    import vlmatch.features.extract as ex

    names = make_images(tmp_path / "im", 4)
    ann = make_karpathy(tmp_path / "d.json", names, ["train"] * 4)
    real_write, real_replace = ex.write_text, ex.os.replace

    def dies_at_ids(path, text):
        if str(path).endswith("ids.txt"):
            raise KeyboardInterrupt("killed while writing ids.txt")
        return real_write(path, text)

    monkeypatch.setattr(ex, "write_text", dies_at_ids)
    with pytest.raises(KeyboardInterrupt):
        extract(tmp_path / "im", tmp_path / "o", ann, TinyBackbone(), progress=False)
    assert not (tmp_path / "o" / "train_ims.npy").exists()  # not marked done
    monkeypatch.setattr(ex, "write_text", real_write)

    def dies_at_the_final_rename(a, b):
        if str(b).endswith("train_ims.npy"):
            raise KeyboardInterrupt("killed at the rename")
        return real_replace(a, b)

    monkeypatch.setattr(ex.os, "replace", dies_at_the_final_rename)
    with pytest.raises(KeyboardInterrupt):
        extract(tmp_path / "im", tmp_path / "o", ann, TinyBackbone(), progress=False)
    monkeypatch.setattr(ex.os, "replace", real_replace)
    bb = TinyBackbone()
    rep = extract(tmp_path / "im", tmp_path / "o", ann, bb, progress=False)
    assert bb.calls == 0 and rep["splits"]["train"]["resumed_from"] == 4  # the features were already done
    sp = PrecompSplit(tmp_path / "o", "train")
    assert sp.ids == names and len(sp.captions) == 20


def test_names_that_cannot_be_one_line_of_ids_txt(tmp_path):
    make_images(tmp_path / "im", 2)
    Image.new("RGB", (8, 8)).save(tmp_path / "im" / "two\nlines.png")
    with pytest.raises(DataError, match=r"lines.png: its name contains a line break.*--skip-bad"):
        extract(tmp_path / "im", tmp_path / "o", None, TinyBackbone(), progress=False)
    assert not (tmp_path / "o").exists()  # refused before any work
    rep = extract(tmp_path / "im", tmp_path / "o", None, TinyBackbone(), skip_bad=True, progress=False)
    assert rep["splits"]["gallery"]["skipped"] == [{"image": "two\nlines.png", "error": "its name contains a line break"}]
    assert (tmp_path / "o" / "ids.txt").read_text().splitlines() == ["img000.jpg", "img001.jpg"]


def _png_claiming(path, width, height):
    """A valid tiny PNG whose header claims another size (what a decompression bomb looks like)."""
    import struct
    import zlib

    Image.new("L", (1, 1)).save(path)
    raw = bytearray(path.read_bytes())
    ihdr = raw[12:29]  # b"IHDR" + 13 bytes of data
    ihdr[4:12] = struct.pack(">II", width, height)
    raw[12:29] = ihdr
    raw[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    path.write_bytes(bytes(raw))


def test_a_decompression_bomb_is_a_bad_image_not_a_crash(tmp_path):
    names = make_images(tmp_path / "im", 2)
    _png_claiming(tmp_path / "im" / "bomb.png", 20000, 20000)
    with pytest.raises(DataError, match=r"bomb.png: has 20000x20000 pixels; the limit is"):
        extract(tmp_path / "im", tmp_path / "o", None, TinyBackbone(), progress=False)
    rep = extract(tmp_path / "im", tmp_path / "o", None, TinyBackbone(), skip_bad=True, progress=False)
    assert [s["image"] for s in rep["splits"]["gallery"]["skipped"]] == ["bomb.png"]
    assert (tmp_path / "o" / "ids.txt").read_text().split() == names


def test_16_bit_images_are_scaled_not_saturated(tmp_path):
    from vlmatch.features.extract import load_image

    grey = np.linspace(0, 65535, 16 * 16).reshape(16, 16).astype(np.uint16)
    Image.fromarray(grey).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    px = load_image(tmp_path / "deep.png", 16)
    np.testing.assert_allclose(px[..., 0], np.rint(grey / 257.0), atol=1)
    assert px[..., 0].min() == 0 and 120 < px[..., 0].mean() < 135  # a mid-grey on average, not white


def test_an_input_size_chooses_the_grid_and_is_recorded(tmp_path):
    """EfficientNet-Lite0 at 64 px: a 2 x 2 grid; features.json records the size, and the backbone rebuilt
    from that record (as search and explain rebuild it for a model trained on those features) is the same."""
    pytest.importorskip("efficientnet_lite_pytorch")
    from vlmatch.features.backbones import backbone_for

    make_images(tmp_path / "im", 2)
    rep = extract(tmp_path / "im", tmp_path / "out", backbone="efficientnet-lite0", progress=False, input_size=64)
    assert np.load(tmp_path / "out" / "ims.npy").shape == (2, 4, 1280)
    assert rep["backbone"]["input_size"] == 64 and rep["backbone"]["grid"] == 2 and rep["regions"] == 4
    again = backbone_for(json.loads((tmp_path / "out" / "features.json").read_text())["backbone"])
    assert again.describe() == rep["backbone"]
    assert backbone_for({"name": "efficientnet-lite0"}).info.input_size == 224  # records from before sizes


@pytest.mark.parametrize("size", [100, 0, 16])
def test_an_input_size_off_the_stride_is_one_clear_error(size):
    from vlmatch.errors import VlmatchError
    from vlmatch.features.backbones import create_backbone

    with pytest.raises(VlmatchError, match=f"input size {size} is not a positive multiple of 32"):
        create_backbone("efficientnet-lite0", input_size=size)


def test_a_checkpoint_trained_at_another_size_is_fed_that_size(tmp_path):
    from vlmatch.features.provenance import resolve_backbone

    ck = tmp_path / "best"
    ck.mkdir()
    (ck / "backbone.json").write_text(json.dumps({"name": "efficientnet-lite0", "input_size": 448, "grid": 14,
                                                  "dim": 1280, "normalisation": "(pixel - 127) / 128"}))
    assert resolve_backbone(ck, None) == {"name": "efficientnet-lite0", "input_size": 448}
    assert resolve_backbone(ck, "efficientnet-lite0") == {"name": "efficientnet-lite0", "input_size": 448}
    with pytest.raises(DataError, match="trained on efficientnet-lite0"):
        resolve_backbone(ck, "resnet152")


def _photo(h, w):
    """Gradients and a ripple, computed on one row and one column and broadcast (the full grids took 1.5 s)."""
    y, x = np.arange(h)[:, None], np.arange(w)[None, :]
    return np.stack(np.broadcast_arrays(x * 255 // w, y * 255 // h,
                                        (np.sin(x / 37.0) * np.cos(y / 23.0) * 120 + 128).astype(int)),
                    axis=2).astype(np.uint8)


@pytest.mark.parametrize("hw,scaled", [((2400, 3200), True), ((375, 500), False)])
def test_a_large_jpeg_is_decoded_at_a_reduced_scale_to_nearly_the_same_pixels(tmp_path, monkeypatch, hw, scaled):
    from vlmatch.features import extract as ex

    path = tmp_path / "p.jpg"
    Image.fromarray(_photo(*hw)).save(path, quality=92)
    with Image.open(path) as im:  # the full decode, then the same resize
        full = np.asarray(im.convert("RGB").resize((320, 320), Image.BILINEAR)).astype(int)
    decoded = []
    real_resize = Image.Image.resize  # the decoded image is the one resized to the input size
    monkeypatch.setattr(Image.Image, "resize", lambda im, *a, **k: decoded.append(im.size) or real_resize(im, *a, **k))
    got = ex.load_image(path, 320).astype(int)
    assert got.shape == (320, 320, 3)
    assert decoded and min(decoded[0]) >= 320  # never below the size asked for
    assert (decoded[0][0] < hw[1]) == scaled  # 3200 x 2400 decodes at 1/4 (800 x 600); 500 x 375 in full
    assert np.abs(got - full).mean() < 1.0 and np.abs(got - full).max() <= 8


def test_mirror_views_are_extracted_beside_a_finished_folder_without_touching_it(tmp_path):
    names = make_images(tmp_path / "im", 5)
    ann = make_karpathy(tmp_path / "d.json", names, ["train", "train", "train", "val", "val"])
    first = extract(tmp_path / "im", tmp_path / "out", ann, TinyBackbone(), batch_size=2, progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir() if p.name.endswith(("npy", "txt"))}
    bb = TinyBackbone()
    rep = extract(tmp_path / "im", tmp_path / "out", ann, bb, batch_size=2, progress=False, mirror=True)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir() if p.name in before}
    assert after == before  # the photo features, captions and ids are the first run's, untouched
    assert rep["splits"]["train"]["seconds"] == first["splits"]["train"]["seconds"]  # its figures kept
    assert rep["splits"]["train"]["mirror"]["images"] == 3 and bb.calls == 2 + 1  # only the mirrors were computed
    sp = PrecompSplit(tmp_path / "out", "train")
    for i, name in enumerate(sp.ids):
        px = load_image(tmp_path / "im" / name, 8)
        want = TinyBackbone()(TinyBackbone().preprocess([px[:, ::-1].copy()]))[0].numpy()
        np.testing.assert_allclose(sp.mirror_image(i), want, rtol=1e-5, atol=1e-5)
    again = TinyBackbone()
    extract(tmp_path / "im", tmp_path / "out", ann, again, batch_size=2, progress=False, mirror=True)
    assert again.calls == 0  # both views complete: nothing recomputed
