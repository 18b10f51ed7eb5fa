"""The pointing game on Flickr30k Entities: does a phrase's heat map peak inside the thing it names?

For every phrase whose Entities chain has a box: the phrase's map (see :mod:`.explainers`) -> its peak, the
centre of the cell with the largest weight (where a bilinear upsampling of the map peaks too) -> a hit when it
falls inside any box of the chain. The features are of the whole photo resized, so cell (r, c) covers
[c/g, (c+1)/g] x [r/g, (r+1)/g] of it. Baselines on the same phrases: ``centre`` (the photo's centre),
``caption_mean`` (the whole caption's map) and ``ceiling`` (some cell centre lies in a box).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..data.entities import TYPES, EntitiesDir, GroundedPhrase, in_box
from ..errors import ConfigError
from ..models.base import MatchingModel
from .explainers import QUERY_METHODS, caption_token_maps, check_method, query_maps, supports, token_spans
from .mirror import grid_of, merge_views, names_a_side
from .pointing_stats import bootstrap_interval

COUNTS = ("pointing", "centre", "caption_mean", "ceiling")  # the method's hits, then the baselines'


def cell_centres(grid: int, width: float, height: float) -> np.ndarray:
    """(g*g, 2) centres (x, y) of a g x g grid's cells, row-major, in the photo's pixel coordinates."""
    c = (np.arange(grid) + 0.5) / grid
    ys, xs = np.meshgrid(c * height, c * width, indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def hit(point, boxes) -> bool:
    return any(in_box(point[0], point[1], b) for b in boxes)


def peak(weights: np.ndarray) -> int:
    """The cell of the largest weight (the first of ties); NaN maps point nowhere (-1)."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).any():
        return -1
    return int(np.nanargmax(np.where(np.isfinite(w), w, -np.inf)))


class Tally:
    """Hits of the method and of each baseline over ``n`` phrases."""

    def __init__(self):
        self.n, self.hits = 0, dict.fromkeys(COUNTS, 0)

    def add(self, *row: bool) -> None:
        self.n += 1
        for name, h in zip(COUNTS, row, strict=True):
            self.hits[name] += h

    def as_dict(self) -> dict:
        return {**{k: round(100.0 * h / self.n, 2) if self.n else None for k, h in self.hits.items()}, "phrases": self.n}


def image_phrase_maps(model: MatchingModel, features: np.ndarray, captions: list[str],
                      phrases: list[GroundedPhrase], method: str, *, as_query: bool = False,
                      mirror: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each phrase's (k,) map and each caption's (k,) mean map for one image (``as_query``: attention and
    contribution too score each phrase, and each caption, as its own query). ``mirror``: the features of the
    image's mirror view; each map is then averaged with that view's, mirrored back (:mod:`.mirror`), except
    where the text read names a side (the phrase scored alone, else its caption): that one is the photo's."""
    maps, caption_maps = _image_phrase_maps(model, features, captions, phrases, method, as_query)
    if mirror is None:
        return maps, caption_maps
    grid = grid_of(len(maps[0]) if maps else len(caption_maps[0]))
    other, other_captions = _image_phrase_maps(model, mirror, captions, phrases, method, as_query)
    alone = method in QUERY_METHODS or as_query
    maps = [m if names_a_side(gp.phrase.text if alone else captions[gp.caption]) else merge_views(m, o, grid)
            for gp, m, o in zip(phrases, maps, other, strict=True)]
    caption_maps = [m if names_a_side(c) else merge_views(m, o, grid)
                    for c, m, o in zip(captions, caption_maps, other_captions, strict=True)]
    return maps, caption_maps


def _image_phrase_maps(model: MatchingModel, features: np.ndarray, captions: list[str],
                       phrases: list[GroundedPhrase], method: str,
                       as_query: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if method in QUERY_METHODS or as_query:
        maps = query_maps(model, features, [gp.phrase.text for gp in phrases] + captions, method)
        return [maps[:, i] for i in range(len(phrases))], [maps[:, len(phrases) + i] for i in range(len(captions))]
    per_caption = caption_token_maps(model, features, captions, method)
    maps: list[np.ndarray] = [np.empty(0)] * len(phrases)
    for ci, caption in enumerate(captions):
        mine = [i for i, gp in enumerate(phrases) if gp.caption == ci]
        spans = token_spans(model, caption, [(phrases[i].phrase.start, phrases[i].phrase.end) for i in mine])
        for i, (a, b) in zip(mine, spans, strict=True):  # past the token limit (a == b): no tokens, no peak
            maps[i] = per_caption[ci][:, a:b].sum(axis=1) if b > a else np.full(per_caption[ci].shape[0], np.nan)
    return maps, [w.sum(axis=1) for w in per_caption]


def pointing_game(model: MatchingModel, features: Sequence[np.ndarray] | np.ndarray, filenames: Sequence[str],
                  entities, method: str, *, grid: int | None = None,
                  progress: Callable | bool = False, phrase_as_query: bool = False,
                  mirror_features: Sequence[np.ndarray] | np.ndarray | None = None) -> dict:
    """Pointing accuracy of ``method``'s maps of ``model`` over every grounded phrase of the images: the JSON the
    ``grounding`` command writes. ``features[i]`` (k = grid², D) belong to ``filenames[i]``; images without an
    Entities file are skipped and counted; ``phrase_as_query`` and ``mirror_features`` as in
    :func:`image_phrase_maps`."""
    check_method(method)
    ents = entities if isinstance(entities, EntitiesDir) else EntitiesDir(entities)
    if not supports(model, method):
        raise ConfigError(f"--method {method}: model {model.name} has no such maps (gradient and occlusion work "
                          f"for every model)")
    k = int(np.asarray(features[0]).shape[0])
    grid = grid or int(round(k ** 0.5))
    if grid * grid != k:
        raise ConfigError(f"{k} image positions are not a square grid: the pointing game needs grid features")
    if mirror_features is not None and len(mirror_features) != len(features):
        raise ConfigError(f"{len(mirror_features)} mirror views for {len(features)} images")
    total, by_type = Tally(), {t: Tally() for t in TYPES}
    per_image: dict[str, list] = {"names": [], "hits": [], "phrases": []}  # for intervals and cross-fitting
    images = skipped = empty = 0
    t0 = time.perf_counter()
    model.eval()
    bar = tqdm(total=len(filenames), desc="pointing game", unit="img", leave=False, disable=not progress)
    for i, name in enumerate(filenames):
        bar.update(1)
        if not ents.has(name):
            skipped += 1
            continue
        sentences, ann, phrases = ents.grounded(name)
        if not phrases:
            continue
        images += 1
        feats = np.asarray(features[i], dtype=np.float32)
        captions = [s.text for s in sentences]
        mirror = None if mirror_features is None else np.asarray(mirror_features[i], dtype=np.float32)
        maps, caption_maps = image_phrase_maps(model, feats, captions, phrases, method, as_query=phrase_as_query,
                                                mirror=mirror)
        centres = cell_centres(grid, ann.width, ann.height)
        centre = (ann.width / 2.0, ann.height / 2.0)
        mine = Tally()
        for gp, m in zip(phrases, maps, strict=True):
            p = peak(m)
            if p < 0:
                empty += 1  # past the model's token limit: no tokens to sum
                continue
            row = (hit(centres[p], gp.boxes), hit(centre, gp.boxes),
                   hit(centres[peak(caption_maps[gp.caption])], gp.boxes),
                   any(hit(c, gp.boxes) for c in centres))
            total.add(*row)
            mine.add(*row)
            for t in set(gp.phrase.types):
                by_type.setdefault(t, Tally()).add(*row)
        if mine.n:
            per_image["names"].append(name)
            per_image["hits"].append(mine.hits["pointing"])
            per_image["phrases"].append(mine.n)
    bar.close()
    if total.n == 0:
        raise ConfigError(f"no phrase with a box among the {len(filenames)} images: is {ents.root} the Entities "
                          f"folder of these images?")
    result = {"method": method, "phrases_as": "query" if phrase_as_query or method in QUERY_METHODS else "tokens",
              "mirror": mirror_features is not None, "model_name": model.name, **total.as_dict(),
              "by_type": {t: v.as_dict() for t, v in by_type.items() if v.n},
              "images": images, "images_without_entities": skipped, "phrases_past_token_limit": empty,
              "grid": grid, "seconds": round(time.perf_counter() - t0, 1), "per_image": per_image}
    result["pointing_ci95"] = list(bootstrap_interval(result))
    return result


def format_grounding(results: dict[str, dict]) -> str:
    """The field's table: one row per (name -> pointing_game result), overall then per type."""
    types = [t for t in TYPES if any(t in r["by_type"] for r in results.values())]
    head = f"{'':24s} {'pointing':>8s} {'centre':>7s} {'capmean':>7s} {'ceiling':>7s} {'phrases':>7s}  " + \
        " ".join(f"{t[:7]:>7s}" for t in types)
    lines = [head]
    for name, r in results.items():
        cells = " ".join(f"{r['by_type'][t]['pointing']:7.1f}" if t in r["by_type"] else f"{'-':>7s}" for t in types)
        lines.append(f"{name[:24]:24s} {r['pointing']:8.1f} {r['centre']:7.1f} {r['caption_mean']:7.1f} "
                     f"{r['ceiling']:7.1f} {r['phrases']:7d}  {cells}")
    return "\n".join(lines)


def dumps(result: dict) -> str:
    return json.dumps(result, indent=2)
