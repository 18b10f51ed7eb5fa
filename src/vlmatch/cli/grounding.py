"""``vlmatch grounding``: the pointing game on Flickr30k Entities boxes (see :mod:`vlmatch.evaluation.grounding`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import ConfigError, DataError
from .common import checkpoint_arg


def add_parser(sub):
    from .explain import METHODS

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
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.add_argument("--backbone", help="image backbone for a photo folder (default: the one the model was trained on)")
    p.add_argument("--weights", help="local weights file for that backbone")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_grounding)


def cmd_grounding(a):

    from ..evaluation.explainers import default_method
    from ..evaluation.grounding import format_grounding, pointing_game
    from ..io import check_writable, write_json
    from ..models.registry import load_model

    if a.json:
        check_writable(a.json)
    if a.model is None:
        from .explain import default_explainer

        a.model, shipped_method = default_explainer()
        a.method = a.method or shipped_method
    model = load_model(a.model)
    method = a.method or default_method(model)
    features, names = split_features(a, model)
    res = pointing_game(model, features, names, a.entities, method, progress=not a.no_progress,
                        phrase_as_query=a.phrase_as_query)
    res = {"model": str(a.model), "data": str(a.data), "split": a.split, **res}
    print(format_grounding({f"{Path(str(a.model)).name} {method}": res}))
    ci = res.get("pointing_ci95")
    if ci:
        print(f"pointing 95 % interval (images resampled with their phrases): {ci[0]:.1f} - {ci[1]:.1f}")
    print(json.dumps({k: v for k, v in res.items() if k != "per_image"}))  # the per-image counts: in --json
    if a.json:
        write_json(a.json, res)
        print(f"wrote {a.json}", file=sys.stderr)


def split_features(a, model):
    """(features (N, k, D) array-like, image names) of the split: from a precomp folder, or extracted now from a
    photo folder with a Karpathy JSON."""
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
    if (root / "features.json").is_file():
        check_backbone(checkpoint_backbone(a.model), read_json(root / "features.json").get("backbone", {}),
                       model.cfg.img_dim, root)
    return sp.features, sp.ids


def _photo_folder(root: Path, a, model):
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from ..features.backbones import backbone_for
    from ..features.photo import load_image
    from ..features.provenance import check_backbone, checkpoint_backbone, resolve_backbone

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
    feats = []
    with torch.inference_mode():
        for i in tqdm(range(0, len(names), 16), desc="features", unit="batch", leave=False, disable=a.no_progress):
            batch = []
            for n in names[i:i + 16]:
                if not (images / n).is_file():
                    raise DataError(images / n, "image named by the Karpathy JSON not found")
                batch.append(load_image(images / n, bb.info.input_size))
            feats.append(bb(bb.preprocess(batch)).numpy())
    if not feats:
        raise ConfigError("no images")
    return np.concatenate(feats), names
