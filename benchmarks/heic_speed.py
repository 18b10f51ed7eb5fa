"""HEIC at speed (issue 60, item 7): 12-megapixel HEIC and JPEG index builds, decoded in the reader thread (as
before) and in worker processes beside the backbone; a HEIC read through an embedded thumbnail against its
full decode.

    python benchmarks/heic_speed.py [--photos 48]       # a timing: run it on a quiet machine

Folders (under $VLMATCH_CACHE/heic_speed/): ``--photos`` Flickr8k val photos upscaled to 4000 x 3000 (as
benchmarks/phone_library.py makes them) saved as JPEG q95, as HEIC q90 with the thumbnail an iPhone writes
(320 x 240: short of the default model's 320 x 320 input on one side, within the reader's MODEL_THUMB_COVER of
it, so the model's input reads it; the row "processes, full decode" reads these files as the reader did before,
the full HEVC decode), and as HEIC q90 with a 512 px thumbnail. Each folder is indexed with
the shipped default model (`build_index`, skip_bad) with ``VLMATCH_DECODE_WORKERS=0`` (the reader thread) and
with the default (one process per core), after a warm-up build; photos/s counts the whole build (model
loading included, the same in every run).

Fidelity: for ``--check`` HEICs of each kind (iPhone's 320 x 240 thumbnail; 512 px), the cosine of the model's
stage-1 image embedding from the thumbnail read to the one from the full decode (the recall of thumbnail reads:
benchmarks/phone_library.py, whose HEICs carry an iPhone's thumbnail). ``--fidelity-only`` measures it again
(any machine), keeping the last run's rates.
Results: benchmarks/results/heic_speed.json and .md, with the host's CPU flags.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import phone_library as P
from harness import write_report
from PIL import Image

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root() / "heic_speed"
RESULTS = HERE / "results" / "heic_speed"


def folder_of(photos, fmt: str) -> Path:
    folder = CACHE / f"{fmt}_{len(photos)}"
    if folder.is_dir() and len(list(folder.iterdir())) == len(photos):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    import pillow_heif

    pillow_heif.register_heif_opener()
    for p in photos:
        with Image.open(P.SHARED / "images" / p["filename"]) as im:
            im = im.convert("RGB")
        big = im.resize((4000, 3000) if im.size[0] >= im.size[1] else (3000, 4000), Image.LANCZOS)
        stem = Path(p["filename"]).stem
        if fmt == "jpeg":
            big.save(folder / f"{stem}.jpg", quality=95)
        else:
            big.save(folder / f"{stem}.heic", "HEIF", quality=90, thumbnails=[320 if fmt == "heic_iphone" else 512])
    return folder


def timed_build(folder: Path, workers: str | None, cover: float | None = None) -> dict:
    """A whole build of ``folder``; ``cover``: the reader's MODEL_THUMB_COVER for this build (1.0: a thumbnail
    must cover the whole input, as before; the forked decoder processes inherit it)."""
    from vlmatch.features import photo

    old = os.environ.pop("VLMATCH_DECODE_WORKERS", None)
    old_cover = photo.MODEL_THUMB_COVER
    if workers is not None:
        os.environ["VLMATCH_DECODE_WORKERS"] = workers
    if cover is not None:
        photo.MODEL_THUMB_COVER = cover
    try:
        return P.build(folder, CACHE / f"index_{folder.name}_{workers}_{cover}")
    finally:
        photo.MODEL_THUMB_COVER = old_cover
        os.environ.pop("VLMATCH_DECODE_WORKERS", None)
        if old is not None:
            os.environ["VLMATCH_DECODE_WORKERS"] = old


def fidelity(folder: Path, n: int) -> dict:
    """Cosine of the default model's stage-1 image vectors: thumbnail read vs full decode."""
    import torch

    from vlmatch.features import photo
    from vlmatch.features.backbones import backbone_for
    from vlmatch.features.provenance import resolve_backbone
    from vlmatch.search.encode import Stage1Source
    from vlmatch.search.job import load_index_model

    model_dir, retriever, _ = P.default_checkpoints()
    model, _ = load_index_model(model_dir)
    s1 = Stage1Source(model, None)
    bb = backbone_for(resolve_backbone(model_dir, None))
    size = bb.info.input_size
    files = sorted(folder.iterdir())[:n]
    thumb = [photo.load_image(f, size) for f in files]
    full = [np.asarray(photo.open_photo(f).resize((size, size), Image.BILINEAR)) for f in files]  # no size: no thumbnail
    with torch.inference_mode():
        vec = [s1.image_vectors(f := bb(bb.preprocess(x)), model.encode_images(f)).float().numpy() for x in (thumb, full)]
    a, b = (v[:, :-2] for v in vec)  # the image part [v, -c, 1] -> v (the offset and the constant are not the photo)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"photos": len(files), "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean())}


def run(a) -> dict:
    photos = P.val_photos(a.photos)
    folders = {fmt: folder_of(photos, fmt) for fmt in ("jpeg", "heic_iphone", "heic_512")}
    P.build(folders["jpeg"], CACHE / "index_warm_up")
    rates = {}
    runs = [(fmt, workers, None) for fmt in folders for workers in ("0", None)]
    runs.insert(3, ("heic_iphone", None, 1.0))  # as the reader was before: the full decode
    for fmt, workers, cover in runs:
        where = ("thread" if workers == "0" else "processes") + (", full decode" if cover == 1.0 else "")
        key = f"{fmt}/{where}"
        rates[key] = timed_build(folders[fmt], workers, cover)
        print(key, rates[key], flush=True)
    return {"command": "python benchmarks/heic_speed.py " + " ".join(sys.argv[1:]),
            "host": {"cpu": cpu_model(), "flags": cpu_flags(), "cores": os.cpu_count()},
            "photos": a.photos, "rates": rates,
            "fidelity": {fmt: fidelity(folders[fmt], a.check) for fmt in ("heic_iphone", "heic_512")}}


def render(r: dict) -> str:
    lines = ["# HEIC at speed (issue 60, item 7)", "", f"Command: `{r['command']}`  ",
             f"Host: {r['host']['cpu']}, {r['host']['cores']} cores ({', '.join(r['host']['flags'])})", "",
             f"{r['photos']} Flickr8k val photos at 12 MP (4000 x 3000), whole index builds with the shipped default:", "",
             "| folder | decoded in | photos/s | seconds |", "|---|---|---:|---:|"]
    for key, v in r["rates"].items():
        fmt, where = key.split("/")
        lines.append(f"| {fmt} | {where} | {v['images_per_s']:.1f} | {v['seconds']:.1f} |")
    lines += ["", "Thumbnail read vs full decode: cosine of the model's stage-1 image embeddings", "",
              "| HEICs | thumbnail | photos | cosine min | mean |", "|---|---|---:|---:|---:|"]
    thumbs = {"heic_iphone": "320 x 240 (iPhone)", "heic_512": "512 x 384"}
    for fmt, f in r["fidelity"].items():
        lines.append(f"| {fmt} | {thumbs[fmt]} | {f['photos']} | {f['cosine_min']:.4f} | {f['cosine_mean']:.4f} |")
    lines += ["", "Recall with the thumbnail read, on the phone library's 200 HEICs (each with an iPhone's 320 x 240 "
              "thumbnail): benchmarks/results/phone_library.md.", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=48)
    ap.add_argument("--check", type=int, default=8, help="HEICs for the fidelity check")
    ap.add_argument("--fidelity-only", action="store_true", help="only the fidelity check (not a timing: any machine)")
    a = ap.parse_args(argv)
    if a.fidelity_only:  # the last run's rates stay; the fidelity rows are measured again
        r = json.loads(RESULTS.with_suffix(".json").read_text())
        photos = P.val_photos(a.check)
        r["fidelity"] = {fmt: fidelity(folder_of(photos, fmt), a.check) for fmt in ("heic_iphone", "heic_512")}
        r["fidelity_command"] = "python benchmarks/heic_speed.py " + " ".join(sys.argv[1:])
        write_report(RESULTS, r, render)
        print(r["fidelity"])
        return
    t0 = time.time()
    r = run(a)
    write_report(RESULTS, r, render)
    print(render(r), f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
