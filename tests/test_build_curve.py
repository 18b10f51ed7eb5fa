"""benchmarks/build_curve.py: the pair it times has the default pair's shape on each backbone and size, and the
table marks the points below the 20 images/s floor."""

from __future__ import annotations

import json

from tests.benchmark_scripts import load_script
from vlmatch import load_model, pretrained


def test_the_timed_pair_is_the_default_pairs_shape_on_the_asked_backbone(tmp_path):
    curve = load_script("build_curve")
    model, retriever = curve._pair(tmp_path, "efficientnet-lite2", 320)
    for ckpt, name in zip((model, retriever), pretrained.default_pair(), strict=True):
        if name is None:  # the default is its own stage 1: no retriever to time
            assert ckpt is None
            continue
        m = load_model(ckpt)
        described = json.loads((ckpt / "backbone.json").read_text())
        assert m.name == pretrained.get(name).model and m.cfg.img_dim == described["dim"]
        assert (described["name"], described["input_size"], described["grid"]) == ("efficientnet-lite2", 320, 10)


def test_the_table_marks_points_below_the_floor():
    curve = load_script("build_curve")
    host = {"cpu": "x", "flags": ["avx2"]}
    rows = [{"isa": "avx2", "backbone": "efficientnet-lite0", "input_size": s, "grid": s // 32, "images_per_s": r,
             "startup_s": 1.0, "images": 100, "threads": 2, "host": host} for s, r in ((224, 45.0), (448, 9.0))]
    text = curve.render({"rows": rows})
    assert "| 45.0 |" in text and "| 9.0 (below 20) |" in text and "AVX2 |" in text
