"""Attention weights of one image-caption pair, for inspection and heat maps.

Every attention model exposes one pair's weights through the protocol method
``model.pair_attention(img, txt)`` (a (k, n) array tying the n words to the k image positions),
so nothing here knows which model it is talking to. :mod:`vlmatch.viz.heatmap` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError
from ..models.base import ImageEncoding, MatchingModel


@dataclass
class PairAttention:
    words: list[str]  # caption tokens, <start>/<end> included (they are encoded too)
    weights: np.ndarray  # (n_regions, n_words)
    axis: str  # "regions": each word's weights over regions sum to 1; "words": each region's over words;
    #            "pair": weights of the (region, word) terms of the score (sum to 1 over the matrix)
    score: float
    grid: int | None = None  # grid side when the k positions are a grid x grid feature map
    image: str | None = None  # the image file, when known
    extra: dict = field(default_factory=dict)  # model-specific vectors (e.g. CAAN's f and g)

    def to_dict(self) -> dict:
        return {"words": self.words, "weights": self.weights.tolist(), "axis": self.axis, "score": self.score,
                "grid": self.grid, "image": self.image, "shape": list(self.weights.shape),
                **{k: np.asarray(v).tolist() for k, v in self.extra.items()}}


@torch.no_grad()
def attention_of_encodings(model: MatchingModel, img: ImageEncoding, caption: str) -> PairAttention:
    """Weights of ``model`` for one encoded image (``img`` holds one item) and one caption text."""
    if not isinstance(caption, str) or not caption.strip():
        raise ConfigError("the caption to explain is empty")
    model.eval()
    tokens, lengths = model.tokenize([caption])
    dev = next(iter(img.tensors().values())).device
    txt = model.encode_texts(tokens.to(dev), lengths.to(dev))
    att = model.pair_attention(img, txt)
    words = model.decode_tokens(tokens[0], int(lengths[0]))
    extra = {k: v for k, v in att.items() if k not in ("weights", "axis")}
    return PairAttention(words, np.asarray(att["weights"]), att["axis"], float(model.score(img, txt)[0, 0]),
                         extra=extra)


@torch.no_grad()
def pair_attention(model: MatchingModel, features, caption: str, mask=None) -> PairAttention:
    """Weights of ``model`` for one image (features (k, img_dim)) and one caption text.

    The caption goes through the model's own ``tokenize``; the weights come from the model's
    ``pair_attention`` (SCAN t-i: for each word, its weights over the regions; SCAN i-t: for each
    region, its weights over the words; CAAN: f_i g_j, the weight of each region-word term).
    """
    model.eval()
    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]  # a copy: memory-mapped input is read-only
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)[None]
    return attention_of_encodings(model, model.encode_images(feats, m), caption)


def add_parser(sub):
    p = sub.add_parser("explain", help="heat map of which image parts each word of a caption attends to",
                       description="Extract the image's features with the backbone the model was trained on, take "
                                   "the model's attention for this one pair (model.pair_attention) and draw one "
                                   "panel per word on one shared colour scale.")
    from ..cli import checkpoint_arg

    p.add_argument("--model", required=True, type=checkpoint_arg,
                   help="checkpoint folder of an attention model, or pretrained:NAME")
    p.add_argument("--image", required=True, help="image file")
    p.add_argument("--text", required=True, help="the caption")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--json", metavar="OUT", help="also write the raw weights as JSON")
    p.add_argument("--backbone", help="image backbone (default: the one the model was trained on)")
    p.add_argument("--weights", help="local weights file for the backbone")
    p.add_argument("--boxes", metavar="FILE.npy", help="(k, 4) region boxes x1 y1 x2 y2 in image pixels "
                                                      "(region features); default: the backbone's grid")
    p.set_defaults(func=cmd_explain)


def cmd_explain(a):
    from pathlib import Path

    from ..errors import DataError
    from ..features.backbones import create_backbone
    from ..features.extract import load_image
    from ..features.provenance import check_backbone, checkpoint_backbone, resolve_backbone_name
    from ..io import check_writable, write_json
    from ..models.registry import load_model
    from .heatmap import render

    if not a.text.strip():
        raise ConfigError("--text is empty: give the caption whose words to explain")
    for out in (a.out, a.json):  # before any work, not after it
        if out:
            check_writable(out)
    boxes = None
    if a.boxes is not None:
        try:
            boxes = np.load(a.boxes, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise DataError(a.boxes, f"not a readable .npy array ({type(e).__name__})") from None
    model = load_model(a.model)
    bb = create_backbone(resolve_backbone_name(a.model, a.backbone), a.weights)
    check_backbone(checkpoint_backbone(a.model), bb.describe(), model.cfg.img_dim, a.model)
    with torch.inference_mode():
        feats = bb(bb.preprocess([load_image(Path(a.image), bb.info.input_size)]))[0].clone()
    att = pair_attention(model, feats.numpy(), a.text)
    att.grid, att.image = bb.info.grid, str(a.image)
    render(att, a.image, a.out, boxes=boxes)
    if a.json:
        write_json(a.json, {"model": str(a.model), "text": a.text, **att.to_dict()})
    print(f"{a.out}: {len(att.words)} words, score {att.score:.4f}")
