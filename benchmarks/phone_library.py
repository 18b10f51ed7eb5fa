"""A phone library (issue #46): the 1,000 Flickr8k val photos stored as a phone stores them, against the
same photos upright, searched by their 5,000 captions with the shipped default model.

    python benchmarks/phone_library.py                  # everything: recall, 12 MP build rate
    python benchmarks/phone_library.py --images 200     # a quicker look

The library (under $VLMATCH_CACHE/phone_library/):
- ``upright/``: every photo re-saved as a JPEG at quality 95;
- ``phone/``: the same photos, one in three stored as a phone stores a portrait shot (the pixels turned a
  quarter, EXIF orientation 6), one in five converted to HEIC (pillow-heif, quality 90, with the 320 px
  thumbnail an iPhone writes, which the model's input reads; a turned one keeps its turn in the container),
  one in a hundred upscaled to 12 megapixels (4000 px wide, JPEG quality 95).
Each folder is indexed with the default model (``vlmatch index build --images DIR`` with no --model) and
every val caption searched as a user would (K = 100 candidates, top 10): text-to-image R@1/5/10, with the
paired difference to the upright library and its 95 % bootstrap interval (images resampled, 1,000 draws).
The same phone library read by the previous photo reader (stored pixels, EXIF orientation ignored, HEIC
files not listed as photos) shows what the reader fixes. Build rate at 12 MP: a folder of 12-megapixel
JPEGs, and one of 12-megapixel HEICs, indexed end to end (decode, backbone, encodings, FAISS, commit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root() / "phone_library"
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
RESULTS = HERE / "results" / "phone_library"
OLD_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif"}  # what the previous reader listed


def val_photos(n: int) -> list[dict]:
    data = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    return [im for im in data["images"] if im["split"] == "val"][:n]


def save_heic(im: Image.Image, path: Path, exif: bytes | None = None) -> None:
    import pillow_heif

    pillow_heif.register_heif_opener()
    # with the thumbnail an iPhone writes (320 px on the long side): the model's input reads it (the reader's
    # MODEL_THUMB_COVER), so the recall below is the thumbnail read's
    im.save(path, "HEIF", quality=90, thumbnails=[320], **({"exif": exif} if exif else {}))


def portrait_exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # display: turn the stored pixels 90 degrees clockwise
    return exif.tobytes()


def make_library(photos: list[dict]) -> dict:
    """Write upright/ and phone/ (skipped when a previous run left them complete); returns the counts."""
    up_dir, phone_dir = CACHE / "upright", CACHE / "phone"
    kinds = {"portrait_tag6": 0, "heic": 0, "upscaled_12mp": 0}
    done = CACHE / f"library_{len(photos)}.json"
    if done.is_file() and up_dir.is_dir() and phone_dir.is_dir():
        return json.loads(done.read_text())
    for d in (up_dir, phone_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for i, p in enumerate(photos):
        stem = Path(p["filename"]).stem
        with Image.open(SHARED / "images" / p["filename"]) as im:
            up = im.convert("RGB")
        up.save(up_dir / f"{stem}.jpg", quality=95)
        turned = i % 3 == 0
        stored = up.transpose(Image.Transpose.ROTATE_90) if turned else up  # orientation 6 shows it upright
        exif = portrait_exif() if turned else None
        kinds["portrait_tag6"] += turned
        if i % 5 == 1:
            save_heic(stored, phone_dir / f"{stem}.heic", exif)
            kinds["heic"] += 1
            continue
        if i % 100 == 2:
            w, h = stored.size
            stored = stored.resize((4000, round(4000 * h / w)) if w >= h else (round(4000 * w / h), 4000), Image.LANCZOS)
            kinds["upscaled_12mp"] += 1
        stored.save(phone_dir / f"{stem}.jpg", quality=95, **({"exif": exif} if exif else {}))
    rec = {"photos": len(photos), **kinds}
    done.write_text(json.dumps(rec))
    return rec


@contextlib.contextmanager
def previous_reader():
    """The photo reader before #46: stored pixels (no EXIF orientation), HEIC not listed as a photo."""
    from vlmatch.features import photo
    from vlmatch.search import scan as S  # the folder scan an index build reads

    saved = photo.upright, S.PHOTO_SUFFIXES, S._image_content
    photo.upright, S.PHOTO_SUFFIXES, S._image_content = (lambda im, orientation: im), OLD_SUFFIXES, (lambda p: False)
    try:
        yield
    finally:
        photo.upright, S.PHOTO_SUFFIXES, S._image_content = saved


def default_checkpoints():
    from vlmatch import pretrained
    from vlmatch.models.registry import resolve_checkpoint

    model, retriever = pretrained.default_pair()
    return resolve_checkpoint(f"pretrained:{model}"), (resolve_checkpoint(f"pretrained:{retriever}") if retriever
                                                       else None), model


def build(folder: Path, out: Path) -> dict:
    from vlmatch.search.build import build_index

    model, retriever, _ = default_checkpoints()
    shutil.rmtree(out, ignore_errors=True)
    n = sum(1 for f in folder.iterdir() if f.is_file())
    t0 = time.perf_counter()
    m = build_index(out, model, images=folder, retriever_ckpt=retriever, progress=False, skip_bad=True)
    secs = time.perf_counter() - t0
    return {"files": n, "indexed": m["counts"]["images"], "seconds": secs, "images_per_s": n / secs}


def ranks(index_dir: Path, photos: list[dict], batch: int = 100) -> np.ndarray:
    """For each val caption (in file order), the rank (1..10) of its photo in the top 10, 0 when absent."""
    from vlmatch.search import Index

    idx = Index.open(index_dir)
    caps, want = [], []
    for p in photos:
        for s in p["sentences"]:
            caps.append(s["raw"])
            want.append(Path(p["filename"]).stem)
    out = np.zeros(len(caps), dtype=np.int64)
    for a in range(0, len(caps), batch):
        for j, hits in enumerate(idx.search_many(caps[a:a + batch], k=10)):
            stems = [Path(h.path).stem for h in hits]
            out[a + j] = stems.index(want[a + j]) + 1 if want[a + j] in stems else 0
    return out


def recalls(r: np.ndarray) -> dict:
    hit = r > 0
    return {f"R@{k}": 100.0 * float((hit & (r <= k)).mean()) for k in (1, 5, 10)}


def paired_interval(a: np.ndarray, b: np.ndarray, per_image: int = 5, draws: int = 1000) -> dict:
    """R@K of ``a`` minus ``b`` (same captions) with a 95 % bootstrap interval over images."""
    rng = np.random.default_rng(0)
    n_img = len(a) // per_image
    out = {}
    for k in (1, 5, 10):
        d = (((a > 0) & (a <= k)).astype(float) - ((b > 0) & (b <= k)).astype(float)).reshape(n_img, per_image).mean(1)
        boots = [100.0 * d[rng.integers(0, n_img, n_img)].mean() for _ in range(draws)]
        out[f"R@{k}"] = {"diff": 100.0 * float(d.mean()), "ci95": [float(np.percentile(boots, 2.5)),
                                                                   float(np.percentile(boots, 97.5))]}
    return out


def big_folder(photos: list[dict], n: int, fmt: str) -> Path:
    """``n`` val photos upscaled to 12 megapixels (4000 x 3000 or 3000 x 4000), as JPEG q95 or HEIC q90."""
    folder = CACHE / f"big_{fmt}_{n}"
    if folder.is_dir() and len(list(folder.iterdir())) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for p in photos[:n]:
        with Image.open(SHARED / "images" / p["filename"]) as im:
            im = im.convert("RGB")
        size = (4000, 3000) if im.size[0] >= im.size[1] else (3000, 4000)
        big = im.resize(size, Image.LANCZOS)
        stem = Path(p["filename"]).stem
        if fmt == "jpeg":
            big.save(folder / f"{stem}.jpg", quality=95)
        else:
            save_heic(big, folder / f"{stem}.heic")
    return folder


def build_rates(photos: list[dict], n_big: int) -> dict:
    """Index build rates in one run, after a warm-up build: ``n_big`` Flickr8k-size JPEGs (the reference), then
    the same photos at 12 MP as JPEG and as HEIC (each build loads the model: the same fixed cost in all three)."""
    ref = CACHE / f"small_jpeg_{n_big}"
    shutil.rmtree(ref, ignore_errors=True)
    ref.mkdir(parents=True)
    for p in photos[:n_big]:
        (ref / p["filename"]).symlink_to((SHARED / "images" / p["filename"]).resolve())
    out = {}
    build(ref, CACHE / "index_warm_up")  # the first build of a process pays the one-time costs (kernels, packing)
    for fmt, folder in (("flickr_jpeg", ref), ("jpeg", big_folder(photos, n_big, "jpeg")),
                        ("heic", big_folder(photos, n_big, "heic"))):
        print(f"building {fmt} ...", flush=True)
        out[fmt] = build(folder, CACHE / f"index_big_{fmt}")
        print(fmt, out[fmt], flush=True)
    return out


def run(n_images: int, n_big: int) -> dict:
    from vlmatch_lab.host import cpu_flags, cpu_model

    torch.set_num_threads(2)
    photos = val_photos(n_images)
    lib = make_library(photos)
    builds, r = {}, {}
    for name, folder, ctx in (("upright", CACHE / "upright", contextlib.nullcontext()),
                              ("phone", CACHE / "phone", contextlib.nullcontext()),
                              ("phone_previous_reader", CACHE / "phone", previous_reader())):
        with ctx:
            print(f"building {name} ...", flush=True)
            builds[name] = build(folder, CACHE / f"index_{name}")
        r[name] = ranks(CACHE / f"index_{name}", photos)
        print(name, builds[name], recalls(r[name]), flush=True)
    big = build_rates(photos, n_big)
    _, _, model = default_checkpoints()
    return {"command": "python benchmarks/phone_library.py" + (f" --images {n_images}" if n_images != 1000 else "")
            + (f" --big {n_big}" if n_big != 24 else ""),
            "host": {"cpu": cpu_model(), "flags": cpu_flags(), "threads": torch.get_num_threads()},
            "model": f"pretrained:{model}", "library": lib, "captions": int(len(r["upright"])), "candidates": 100,
            "builds": builds, "recall": {k: recalls(v) for k, v in r.items()},
            "phone_minus_upright": paired_interval(r["phone"], r["upright"]),
            # the HEICs alone (make_library's one in five; read through their 320 px thumbnail): their captions
            "heic_minus_upright": paired_interval(*(v.reshape(-1, 5)[1::5].ravel() for v in (r["phone"], r["upright"]))),
            "previous_reader_minus_upright": paired_interval(r["phone_previous_reader"], r["upright"]),
            "build_12mp": big}


def render(res: dict) -> str:
    lib = res["library"]
    lines = ["# A phone library (issues #46, #60)", "",
             f"`{res['command']}` -- host: {res['host']['cpu']}, {res['host']['threads']} threads, flags "
             f"{' '.join(res['host']['flags'])}. Model {res['model']} (the shipped default), K = "
             f"{res['candidates']} candidates, top 10, {res['captions']} Flickr8k val captions.", "",
             f"The library: {lib['photos']} val photos; {lib['portrait_tag6']} stored as a phone stores a portrait "
             f"shot (pixels turned, EXIF orientation 6), {lib['heic']} as HEIC, {lib['upscaled_12mp']} upscaled to "
             "12 MP; against the same photos upright (JPEG quality 95).", "",
             "| library | reader | indexed / files | R@1 | R@5 | R@10 | build images/s |", "|---|---|---|---|---|---|---|"]
    names = {"upright": ("upright", "current"), "phone": ("phone", "current"),
             "phone_previous_reader": ("phone", "previous (orientation ignored, no HEIC)")}
    for key, (lib_name, reader) in names.items():
        rc, b = res["recall"][key], res["builds"][key]
        lines.append(f"| {lib_name} | {reader} | {b['indexed']} / {b['files']} | {rc['R@1']:.1f} | {rc['R@5']:.1f} | "
                     f"{rc['R@10']:.1f} | {b['images_per_s']:.1f} |")
    lines += ["", "Paired differences against the upright library (points of recall, 95 % bootstrap interval over "
              "images):", "", "| | R@1 | R@5 | R@10 |", "|---|---|---|---|"]
    for key, label in (("phone_minus_upright", "phone, current reader"),
                       ("heic_minus_upright", f"its {lib['heic']} HEICs alone (their 320 px thumbnails read)"),
                       ("previous_reader_minus_upright", "phone, previous reader")):
        if key not in res:
            continue
        d = res[key]
        lines.append(f"| {label} | " + " | ".join(f"{d[k]['diff']:+.2f} [{d[k]['ci95'][0]:+.2f}, {d[k]['ci95'][1]:+.2f}]"
                                                  for k in ("R@1", "R@5", "R@10")) + " |")
    cmd = res.get("build_command", res["command"])
    lines += ["", f"Index build at 12 megapixels, whole builds (model load, decode, backbone, encodings, FAISS, commit), "
              f"one run of `{cmd}`, beside the same photos at Flickr size:", "",
              "| files | count | seconds | images/s | time per photo vs Flickr size |", "|---|---|---|---|---|"]
    labels = {"flickr_jpeg": "Flickr8k JPEG (500 x 375)", "jpeg": "12 MP JPEG", "heic": "12 MP HEIC"}
    ref = res["build_12mp"].get("flickr_jpeg")
    for fmt, b in res["build_12mp"].items():
        ratio = f"{b['seconds'] / ref['seconds']:.2f}x" if ref else "-"
        lines.append(f"| {labels.get(fmt, fmt)} | {b['files']} | {b['seconds']:.1f} | {b['images_per_s']:.1f} | {ratio} |")
    if res["host"].get("note"):
        lines += ["", res["host"]["note"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    from harness import write_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1000, help="val photos in the library (default all 1,000)")
    ap.add_argument("--big", type=int, default=24, help="12-megapixel photos per format for the build rate")
    ap.add_argument("--build-only", action="store_true",
                    help="measure the build rates again (on a quiet machine), keeping the last run's recall figures")
    a = ap.parse_args(argv)
    if a.build_only:  # the recall figures of the last full run stay; the build rates are measured again
        res = json.loads(RESULTS.with_suffix(".json").read_text())
        res["build_12mp"] = build_rates(val_photos(a.images), a.big)
        res["build_command"] = f"python benchmarks/phone_library.py --build-only --big {a.big}"
    else:
        res = run(a.images, a.big)
    write_report(RESULTS, res, render)
    print(render(res))


if __name__ == "__main__":
    main()
