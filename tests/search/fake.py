"""A small in-memory backend with the SearchBackend methods, for tests of the HTTP layer alone.

Each image is a flat colour; its "caption" names the colour. ``search`` ranks images by how many
query words their caption shares (ties by id), so rankings are predictable. ``gate`` (a
threading.Event), when set on the object, makes model calls wait on it: tests use it to fill the pool.
"""

from __future__ import annotations

import io
import threading

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (30, 60, 220), "yellow": (240, 220, 40)}


class FakeBackend:
    model_name = "fake"

    def __init__(self, folder, n=8, captions=True):
        self.dir = folder
        self.paths, self.captions = [], []
        names = list(COLOURS)
        for i in range(n):
            colour = names[i % len(names)]
            fmt = "PNG" if i == 1 else "JPEG"
            p = folder / f"img{i:03d}.{fmt.lower()}"
            Image.new("RGB", (320, 240), COLOURS[colour]).save(p, fmt)
            self.paths.append(p)
            self.captions.append(f"a {colour} square")
        self.size = n
        self.n_captions = len(self.captions) if captions else 0
        self.gate: threading.Event | None = None
        self.asked_ids: list = []

    def _wait(self):
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"

    def search(self, text, k, candidates):
        self._wait()
        words = set(text.lower().split())
        scored = [(len(words & set(c.split())) / 3 + 0.001 * (self.size - i), i) for i, c in enumerate(self.captions)]
        top = sorted(scored, key=lambda t: -t[0])[:min(candidates, self.size)]
        return [{"id": i, "path": str(self.paths[i].relative_to(self.dir)), "score": s, "stage1_score": s / 2}
                for s, i in top[:k]]

    def search_image(self, image, image_id, k):
        self._wait()
        if image is not None:
            with Image.open(io.BytesIO(image)) as im:
                rgb = np.asarray(im.convert("RGB"), dtype=float).reshape(-1, 3).mean(0)
        else:
            rgb = np.array(COLOURS[self.captions[image_id].split()[1]], dtype=float)
        d = {i: -float(np.abs(rgb - COLOURS[c.split()[1]]).sum()) for i, c in enumerate(self.captions)}
        return [{"id": i, "text": self.captions[i], "score": s} for i, s in sorted(d.items(), key=lambda t: -t[1])[:k]]

    def search_like(self, image, image_id, k, candidates, text=None, text_weight=None, where=None):
        """Images by closeness of colour to the uploaded image's mean colour or to image ``image_id``'s."""
        self._wait()
        if image is not None:
            with Image.open(io.BytesIO(image)) as im:
                rgb = np.asarray(im.convert("RGB"), dtype=float).reshape(-1, 3).mean(0)
        else:
            rgb = np.array(COLOURS[self.captions[image_id].split()[1]], dtype=float)
        self.liked = (image_id, text, text_weight)
        scored = [(1 - float(np.abs(rgb - COLOURS[c.split()[1]]).sum()) / 765, i) for i, c in enumerate(self.captions)]
        top = sorted(scored, key=lambda t: (-t[0], t[1]))[:min(candidates, self.size)]
        return [{"id": i, "path": str(self.paths[i].relative_to(self.dir)), "score": s, "stage1_score": s}
                for s, i in top[:k]]

    def path_of(self, image_id):
        self.asked_ids.append(image_id)
        assert isinstance(image_id, int)
        return self.paths[image_id] if 0 <= image_id < self.size else None

    def explain(self, image_id, text, method=None):
        self._wait()
        words = ["<start>", *text.lower().split(), "<end>"]
        rng = np.random.default_rng(image_id)
        w = rng.random((len(words), 4))
        w /= w.sum(1, keepdims=True)
        return {"method": method or "attention", "words": words, "weights": w.tolist(), "axis": "regions",
                "grid": [2, 2], "score": 0.5}

    def explain_png(self, image_id, text, method=None):
        self._wait()
        buf = io.BytesIO()
        Image.new("RGB", (64, 32), (0, 0, 0)).save(buf, "PNG")
        return buf.getvalue()
