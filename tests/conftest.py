
import numpy as np
import pytest

from vlmatch.data.synth import ToyWorld, ToyWorldConfig


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never touch the user's ~/.cache from tests, nor the host's torch.compile cache: Inductor's on-disk cache
    (/tmp/torchinductor_$USER) does not key its kernels by ATEN_CPU_CAPABILITY, so kernels cached by an AVX-512
    process and loaded by one held to AVX2 gave non-finite scores and crashed the process (the compiled-engine
    and compiled-training tests). One cache per test session: kernels compiled by this process only."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("VLMATCH_CACHE", str(base / "vlcache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(base / "inductor"))


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    """A small toy world (600 train / 200 dev / 200 test images) shared by the training tests."""
    out = tmp_path_factory.mktemp("toy")
    ToyWorld(ToyWorldConfig(seed=1, n_train=600, n_dev=200, n_test=200, img_dim=32)).write(out)
    return out


def write_precomp(root, split, feats, captions, ids=None):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{split}_ims.npy", np.asarray(feats, dtype=np.float32))
    (root / f"{split}_caps.txt").write_text("\n".join(captions) + "\n", encoding="utf-8")
    if ids is not None:
        (root / f"{split}_ids.txt").write_text("\n".join(ids) + "\n")
    return root
