import json

import numpy as np

from vlmatch.data.precomp import PrecompSplit
from vlmatch.data.synth import ToyWorld, ToyWorldConfig


def test_toyworld_is_deterministic_and_loads(tmp_path):
    cfg = ToyWorldConfig(seed=3, n_train=20, n_dev=10, n_test=10)
    ToyWorld(cfg).write(tmp_path / "a")
    ToyWorld(cfg).write(tmp_path / "b")
    for name in ("train_ims.npy", "test_caps.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    sp = PrecompSplit(tmp_path / "a", "train")
    assert sp.features.shape == (20, cfg.n_regions, cfg.img_dim) and sp.per_image == 5
    stats = json.loads((tmp_path / "a" / "toyworld.json").read_text())
    assert stats["splits"]["train"]["captions"] == 100


def test_mean_pooling_cannot_tell_swapped_bindings():
    """The design claim: {red dog, blue car} and {blue dog, red car} have the same mean feature."""
    w = ToyWorld(ToyWorldConfig(noise=0.0, n_regions=2, min_objects=2, max_objects=2))
    rng = np.random.default_rng(0)
    a = w.features([(0, 0, 0, 0), (2, 1, 0, 0)], rng).mean(axis=0)
    b = w.features([(0, 1, 0, 0), (2, 0, 0, 0)], rng).mean(axis=0)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert not np.allclose(np.sort(w.features([(0, 0, 0, 0), (2, 1, 0, 0)], rng), axis=0),
                           np.sort(w.features([(0, 1, 0, 0), (2, 0, 0, 0)], rng), axis=0))


def test_captions_mention_only_objects_in_the_scene():
    w = ToyWorld(ToyWorldConfig(seed=5))
    rng = np.random.default_rng(1)
    from vlmatch.data.synth import CATEGORIES

    for _ in range(50):
        objs = w.scene(rng)
        cap = w.caption(objs, rng).split()
        present = {s for o in objs for s in CATEGORIES[o[0]]}
        absent = {s for i, c in enumerate(CATEGORIES) if i not in {o[0] for o in objs} for s in c}
        assert any(t in present for t in cap) and not any(t in absent for t in cap)


def test_cache_is_regenerated_when_the_generator_changes(tmp_path, monkeypatch):
    import vlmatch.data.synth as synth

    cfg = ToyWorldConfig(n_train=10, n_dev=10, n_test=10)
    synth.ensure_toyworld(tmp_path, cfg)
    stamp = (tmp_path / "train_caps.txt").stat().st_mtime_ns
    synth.ensure_toyworld(tmp_path, cfg)
    assert (tmp_path / "train_caps.txt").stat().st_mtime_ns == stamp  # cached
    monkeypatch.setattr(synth, "GENERATOR_VERSION", synth.GENERATOR_VERSION + 1)
    synth.ensure_toyworld(tmp_path, cfg)
    meta = json.loads((tmp_path / "toyworld.json").read_text())
    assert meta["generator_version"] == synth.GENERATOR_VERSION
