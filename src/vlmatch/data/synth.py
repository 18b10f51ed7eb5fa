"""The bundled default data: a synthetic "toy world" in the precomp format, deterministic given the seed.

Each image is a scene of objects (category, colour, size, position; a region's feature is the sum of fixed random
codes of the four, plus noise), padded with background regions. Captions mention 2-3 of its objects. Mean-pooling
{red dog, blue car} and {blue dog, red car} gives the same vector, so a global model cannot tell such scenes apart
while a word-region attention model can: the data separates the two kinds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..io import save_npy, write_json, write_text

CATEGORIES = [("dog", "puppy"), ("cat", "kitten"), ("car", "automobile"), ("bicycle", "bike"),
              ("horse", "pony"), ("bird", "sparrow"), ("boat", "ship"), ("ball",), ("chair", "seat"),
              ("tree",), ("umbrella",), ("kite",), ("truck", "lorry"), ("cup", "mug"), ("lamp",),
              ("book",)]
COLOURS = [("red", "crimson"), ("blue",), ("green",), ("yellow",), ("black",), ("white",), ("orange",),
           ("purple", "violet")]
SIZES = [("small", "little", "tiny"), ("large", "big", "huge")]
POSITIONS = [("on the left", "at the left"), ("on the right", "at the right"), ("at the top", "up high"),
             ("at the bottom", "down low"), ("in the middle", "in the center")]
# Bumped whenever the generator's output changes, so cached worlds are regenerated.
GENERATOR_VERSION = 2

TEMPLATES = {
    1: ["{0}", "a photo of {0}", "there is {0}", "{0} in the picture", "an image showing {0}"],
    2: ["{0} and {1}", "{0} next to {1}", "there is {0} and {1}", "a photo of {0} with {1}",
        "{0} near {1}", "{1} beside {0}"],
    3: ["{0} , {1} and {2}", "{0} near {1} and {2}", "a scene with {0} , {1} and {2}",
        "there are {0} , {1} and {2}"],
}


@dataclass(frozen=True)
class ToyWorldConfig:
    seed: int = 0
    n_train: int = 3000
    n_dev: int = 1000
    n_test: int = 1000
    captions_per_image: int = 5
    n_regions: int = 8
    img_dim: int = 64
    min_objects: int = 3
    max_objects: int = 5
    noise: float = 0.15
    n_backgrounds: int = 4
    p_colour: float = 0.9
    p_size: float = 0.3
    p_position: float = 0.3


class ToyWorld:
    def __init__(self, cfg: ToyWorldConfig = ToyWorldConfig()):
        if cfg.max_objects > cfg.n_regions:
            raise ValueError("max_objects must not exceed n_regions")
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        d = cfg.img_dim
        # Attribute codes fixed by the seed; the size code includes a "medium" value (index 2).
        self.codes = {
            "category": rng.normal(0, 1 / np.sqrt(d), (len(CATEGORIES), d)),
            "colour": rng.normal(0, 1 / np.sqrt(d), (len(COLOURS), d)),
            "size": rng.normal(0, 0.5 / np.sqrt(d), (len(SIZES) + 1, d)),
            "position": rng.normal(0, 0.5 / np.sqrt(d), (len(POSITIONS), d)),
            "background": rng.normal(0, 1 / np.sqrt(d), (cfg.n_backgrounds, d)),
        }

    def scene(self, rng) -> list[tuple[int, int, int, int]]:
        c = self.cfg
        n = int(rng.integers(c.min_objects, c.max_objects + 1))
        cats = rng.choice(len(CATEGORIES), size=n, replace=False)
        return [(int(cat), int(rng.integers(len(COLOURS))), int(rng.integers(len(SIZES) + 1)),
                 int(rng.integers(len(POSITIONS)))) for cat in cats]

    def features(self, objects, rng) -> np.ndarray:
        c, k = self.cfg, self.codes
        rows = [k["category"][o[0]] + k["colour"][o[1]] + k["size"][o[2]] + k["position"][o[3]] for o in objects]
        while len(rows) < c.n_regions:
            rows.append(k["background"][rng.integers(c.n_backgrounds)])
        x = np.stack(rows) + rng.normal(0, c.noise / np.sqrt(c.img_dim), (c.n_regions, c.img_dim))
        return x[rng.permutation(c.n_regions)].astype(np.float32)

    def phrase(self, obj, rng) -> str:
        c = self.cfg
        cat, col, size, pos = obj
        words = []
        if size < len(SIZES) and rng.random() < c.p_size:
            words.append(rng.choice(SIZES[size]))
        if rng.random() < c.p_colour:
            words.append(rng.choice(COLOURS[col]))
        words.append(rng.choice(CATEGORIES[cat]))
        text = " ".join(words)
        if rng.random() < c.p_position:
            text += " " + rng.choice(POSITIONS[pos])
        det = rng.choice(["a", "the", "one"]) if words[0][0] not in "aeiou" else rng.choice(["an", "the", "one"])
        return f"{det} {text}"

    def caption(self, objects, rng) -> str:
        # 2-3 objects: a one-object caption fits several scenes of a batch and stalls hardest-negative training
        m = int(rng.choice([2, 3], p=[0.6, 0.4]))
        m = min(m, len(objects) - 1)  # never mention every object
        chosen = rng.choice(len(objects), size=m, replace=False)
        template = rng.choice(TEMPLATES[m])
        return template.format(*[self.phrase(objects[i], rng) for i in chosen])

    def split(self, n_images: int, rng):
        feats, caps, scenes = [], [], []
        for _ in range(n_images):
            objects = self.scene(rng)
            scenes.append(objects)
            feats.append(self.features(objects, rng))
            caps.extend(self.caption(objects, rng) for _ in range(self.cfg.captions_per_image))
        return np.stack(feats), caps, scenes

    def write(self, out_dir) -> dict:
        """Write train/dev/test in the precomp layout plus ``toyworld.json``; returns the stats."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stats = {"generator_version": GENERATOR_VERSION, "config": asdict(self.cfg), "splits": {}}
        for i, (name, n) in enumerate((("train", self.cfg.n_train), ("dev", self.cfg.n_dev), ("test", self.cfg.n_test))):
            rng = np.random.default_rng([self.cfg.seed, i + 1])
            feats, caps, scenes = self.split(n, rng)
            save_npy(out / f"{name}_ims.npy", feats)
            write_text(out / f"{name}_caps.txt", "\n".join(caps) + "\n")
            write_text(out / f"{name}_ids.txt", "\n".join(f"{name}_{j:05d}" for j in range(n)) + "\n")
            lengths = [len(c.split()) for c in caps]
            stats["splits"][name] = {
                "images": n, "captions": len(caps), "regions_per_image": self.cfg.n_regions,
                "objects_per_image": float(np.mean([len(s) for s in scenes])),
                "words_per_caption": float(np.mean(lengths)),
                "distinct_captions": len(set(caps)),
            }
        stats["grammar_words"] = _grammar_words()
        write_json(out / "toyworld.json", stats)
        return stats


def _grammar_words() -> int:
    words = set()
    for group in (CATEGORIES, COLOURS, SIZES, POSITIONS):
        for syns in group:
            for s in syns:
                words.update(s.split())
    for ts in TEMPLATES.values():
        for t in ts:
            words.update(w for w in t.split() if not w.startswith("{"))
    return len(words | {"a", "an", "the", "one"})


def ensure_toyworld(out_dir, cfg: ToyWorldConfig = ToyWorldConfig()) -> Path:
    """Generate the toy world into ``out_dir`` unless an identical one is already there."""
    import json

    out = Path(out_dir)
    meta = out / "toyworld.json"
    if meta.is_file():
        try:
            old = json.loads(meta.read_text())
            if old["config"] == asdict(cfg) and old.get("generator_version") == GENERATOR_VERSION:
                return out
        except (ValueError, KeyError):
            pass
    ToyWorld(cfg).write(out)
    return out
