"""``vlmatch grounding``: the pointing game on Flickr30k Entities boxes (see :mod:`vlmatch.evaluation.grounding`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import DataError
from .common import add_backbone_args, check_json_out, checkpoint_arg, write_json_out


def add_parser(sub):
    from .explain import METHODS, add_mirror_arg

    p = sub.add_parser("grounding", help="pointing accuracy of a model's heat maps on Flickr30k Entities boxes",
                       description="For every phrase with a box: the phrase's heat map -> its peak -> a hit when it "
                                   "falls inside one of the phrase's boxes. Prints pointing accuracy overall and per "
                                   "Entities type with three baselines on the same phrases (image centre, the "
                                   "caption's own map, the best cell centre of the grid), as a table and as JSON.")
    p.add_argument("--model", type=checkpoint_arg, help="checkpoint folder or pretrained:NAME (default: the shipped "
                                                        "default explainer, see `vlmatch pretrained`)")
    p.add_argument("--data", required=True, help="what `features extract` wrote (a precomp folder with {split}_ids.txt "
                                                 "naming the images), or a photo folder with a Karpathy JSON (features "
                                                 "are extracted on the fly with the model's backbone)")
    p.add_argument("--split", default="val", help="split (default val; the precomp layout's 'dev' is accepted for it)")
    p.add_argument("--entities", required=True, help="folder with Annotations/ and Sentences/ (Flickr30k Entities)")
    p.add_argument("--method", choices=METHODS, help="explanation method (default: the model's shipped one, else "
                                                     "contribution where the model has it, else gradient)")
    p.add_argument("--phrase-as-query", action="store_true",
                   help="attention/contribution: score each phrase as its own query (default: the sum of its tokens' "
                        "maps in its caption; gradient and occlusion always score the phrase alone)")
    p.add_argument("--max-images", type=int, help="only the first N images of the split")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON (- for standard output)")
    add_backbone_args(p, "image backbone for a photo folder (default: the one the model was trained on)",
                      "local weights file for that backbone")
    add_mirror_arg(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_grounding)


def cmd_grounding(a):
    from ..evaluation.explainers import default_method
    from ..evaluation.grounding import format_grounding, pointing_game
    from ..models.registry import load_model
    from .explain import default_explainer, recorded_mirror

    check_json_out(a.json)
    default_explainer(a)
    model = load_model(a.model)
    method = a.method or default_method(model)
    features, names, images = split_features(a, model)
    mirror = recorded_mirror(a.model) if a.mirror is None else a.mirror
    mirror_features = mirror_views(a, images, names) if mirror else None
    res = pointing_game(model, features, names, a.entities, method, progress=not a.no_progress,
                        phrase_as_query=a.phrase_as_query, mirror_features=mirror_features)
    res = {"model": str(a.model), "data": str(a.data), "split": a.split, **res}
    print(format_grounding({f"{Path(str(a.model)).name} {method}" + (" + mirror" if mirror else ""): res}))
    ci = res.get("pointing_ci95")
    if ci:
        print(f"pointing 95 % interval (images resampled with their phrases): {ci[0]:.1f} - {ci[1]:.1f}")
    print(json.dumps({k: v for k, v in res.items() if k != "per_image"}))  # the per-image counts: in --json
    if a.json:
        write_json_out(a.json, res)
        print(f"wrote {a.json}", file=sys.stderr)


def split_features(a, model):
    """(features (N, k, D) array-like, image names, the images' folder or None) of the split: from a precomp
    folder (its features.json names the photos' folder), or extracted now from a photo folder with a Karpathy
    JSON."""
    root = Path(a.data).expanduser()
    if not root.is_dir():
        raise DataError(root, "data folder not found")
    for split in dict.fromkeys([a.split, {"val": "dev", "dev": "val"}.get(a.split, a.split)]):
        if (root / f"{split}_ims.npy").is_file():
            return _precomp(root, split, a, model)
    return _photo_folder(root, a, model)


def _precomp(root: Path, split: str, a, model):
    from ..data.precomp import PrecompSplit
    from ..features.provenance import check_backbone, checkpoint_backbone
    from ..io import read_json

    sp = PrecompSplit(root, split, max_images=a.max_images)
    if sp.ids is None:
        raise DataError(root / f"{split}_ids.txt", "not found: the pointing game needs the image names")
    described = read_json(root / "features.json") if (root / "features.json").is_file() else {}
    if described:
        check_backbone(checkpoint_backbone(a.model), described.get("backbone", {}), model.cfg.img_dim, root)
    images = described.get("images_dir")
    return sp.features, sp.ids, Path(images) if images else None


def mirror_views(a, images: Path | None, names: list[str]):
    """The split's mirror-view features (``--mirror``), extracted from its photos with the model's backbone."""
    from ..features.backbones import backbone_for
    from ..features.provenance import resolve_backbone
    from ..features.views import photo_features

    if images is None or not images.is_dir():
        where = Path(a.data) / "features.json"
        raise DataError(where, f"--mirror needs the photos of these features, and the images folder it names "
                               f"({images}) is not there: pass --data the photo folder, or --no-mirror")
    bb = backbone_for(resolve_backbone(a.model, a.backbone), a.weights)
    return photo_features(bb, [images / n for n in names], mirror=True, progress=not a.no_progress,
                          desc="mirror views")


def _photo_folder(root: Path, a, model):
    from ..features.backbones import backbone_for
    from ..features.provenance import check_backbone, checkpoint_backbone, resolve_backbone
    from ..features.views import photo_features

    jsons = [p for p in sorted(root.glob("*.json")) if p.name != "features.json"]
    if not jsons:
        raise DataError(root, f"neither {a.split}_ims.npy (features extract's output) nor a Karpathy JSON in it")
    try:
        meta = json.loads(jsons[0].read_text(encoding="utf-8"))
        names = [im["filename"] for im in meta["images"] if im.get("split") == a.split]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(jsons[0], f"not a Karpathy split file ({type(e).__name__}: {e})") from None
    if not names:
        raise DataError(jsons[0], f"no image of split {a.split!r}")
    names = names[: a.max_images] if a.max_images else names
    images = root / "images" if (root / "images").is_dir() else root
    bb = backbone_for(resolve_backbone(a.model, a.backbone), a.weights)
    check_backbone(checkpoint_backbone(a.model), bb.describe(), model.cfg.img_dim, a.model)
    return photo_features(bb, [images / n for n in names], progress=not a.no_progress), names, images
