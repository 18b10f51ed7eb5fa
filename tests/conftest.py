"""Shared fixtures, and how the suite spreads over processes (pyproject.toml: ``-n auto --dist loadfile``)."""

import os
import sys

# Each xdist worker takes its share of the cores for torch, OpenMP and BLAS (set before numpy and torch load, and
# inherited by the processes a test starts). Two workers each running two OpenMP threads on two cores made every
# training about 4x slower than alone (the threads spin-wait on each other): a SCAN toy-world run took 92 s beside
# another such run against 22 s alone, and 22 s beside it with one thread each.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
THREADS = max(1, (os.cpu_count() or 1) // WORKERS) if WORKERS else None
if THREADS:
    assert "numpy" not in sys.modules and "torch" not in sys.modules, "a plugin loaded numpy or torch before this"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(THREADS)

# Where PYTHONDONTWRITEBYTECODE is set, the suite keeps its bytecode in pytest's cache folder (nothing lands in the
# tree or in site-packages): without it every process compiled the package and pytest rewrote the asserts of every
# test module again, 9.5 s of the fast loop's collection (each worker collects every module) against 3.1 s with the
# bytecode kept. The processes a test starts use the same folder.
if sys.dont_write_bytecode:
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), ".pytest_cache", "pycache")
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from vlmatch.data.synth import ToyWorld, ToyWorldConfig  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml): two workers per core, eight at most, for the whole suite or named folders.
    Most of the Milvus server tests' time is waiting on the server's timers (tests/search/backends/milvus: 805 s
    in one process, 191 s of it on a CPU), so more workers than cores overlap those waits with the trainings.
    A run of named files or tests stays in this process (workers take ~10 s to start); ``-n 0`` always does.
    The fast loop (``-m "not slow"``) has no server waits to overlap: one worker per core, each paying the
    collection and the session fixtures once."""
    if config.args and all(arg.split("::")[0].endswith(".py") for arg in config.args):
        return 0
    per_core = 1 if "not slow" in (config.getoption("markexpr") or "") else 2
    return min(8, per_core * (os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """The files with the most slow tests first (stable otherwise): with ``--dist loadfile`` a long file that
    starts last runs on alone while the other workers idle."""
    slow = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture(autouse=True)
def _thread_share():
    """Every test starts at this worker's share of the cores: a training with ``train.threads: 2`` sets torch's
    count for the whole process, which would stay so for the tests after it."""
    yield
    torch = sys.modules.get("torch")
    if THREADS and torch is not None and torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)


# The parts of $VLMATCH_CACHE that are pure functions of their key (the concept names' sentence vectors, keyed by
# the lexicon's digest, the text encoder's hash and the template; the files' digests, keyed by path and stat stamp;
# the toy world, keyed by its config and generator version in toyworld.json, written after its files), written whole
# or not at all: kept in pytest's own cache folder between runs and shared by the workers. The concept names alone
# cost each process that computes them ~8 s on a core (every first index build of the shipped default), the toy
# world ~3 s (every first `--data toyworld`).
DERIVED = ("concepts", "digests", "toyworld")


@pytest.fixture(scope="session")
def _derived_shared(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: shared by this run only
    return cache.mkdir("vlmatch-derived") if cache is not None else tmp_path_factory.getbasetemp().parent / "derived"


@pytest.fixture(scope="session")
def _derived_cache(tmp_path_factory, _derived_shared):
    shared = _derived_shared
    vlcache = tmp_path_factory.getbasetemp() / "vlcache"
    vlcache.mkdir(exist_ok=True)
    for name in DERIVED:
        (shared / name).mkdir(parents=True, exist_ok=True)
        if not (vlcache / name).exists():
            (vlcache / name).symlink_to(shared / name, target_is_directory=True)
    return vlcache


@pytest.fixture(scope="session")
def _basis_memo(_derived_shared):
    """The concept names' principal directions (an SVD in float64: ~1 s on a core, at every index build and open
    of the shipped default), computed once per name vectors and dims and kept beside the derived caches."""
    import hashlib

    import torch

    from vlmatch.io import save_npy
    from vlmatch.models import concepts

    compute = concepts.principal_directions
    folder = _derived_shared / "basis"
    folder.mkdir(parents=True, exist_ok=True)

    def principal_directions(names, dims):
        array = np.ascontiguousarray(names.detach().cpu().numpy())
        key = hashlib.sha256(f"{array.dtype}{array.shape}{dims}".encode() + array.tobytes()).hexdigest()[:24]
        path = folder / f"{key}.npy"
        if path.exists():
            return torch.from_numpy(np.load(path))
        basis = compute(names, dims)
        save_npy(path, basis.numpy())
        return basis

    return concepts, "principal_directions", principal_directions


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, _derived_cache, _basis_memo):
    """Never touch the user's ~/.cache from tests, nor the host's torch.compile cache: Inductor's on-disk cache
    (/tmp/torchinductor_$USER) does not key its kernels by ATEN_CPU_CAPABILITY, so kernels cached by an AVX-512
    process and loaded by one held to AVX2 gave non-finite scores and crashed the process (the compiled-engine
    and compiled-training tests). One cache per test process: kernels compiled by this process only."""
    monkeypatch.setenv("VLMATCH_CACHE", str(_derived_cache))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))
    monkeypatch.setattr(*_basis_memo)


def made_once(tmp_path_factory, name, make):
    """A folder made by ``make(folder)`` once per run, shared by the run's worker processes (they wait on a lock
    while one of them makes it): a session fixture's data that is a function of fixed inputs alone."""
    import shutil

    from vlmatch.io import shared_lock

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    with shared_lock(f"{folder}.lock", True, "made_once"):
        done = folder.with_name(f"{name}.made")  # beside it: the folder holds only what make wrote
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    """A small toy world (600 train / 200 dev / 200 test images) shared by the training tests."""
    return made_once(tmp_path_factory, "toy", ToyWorld(ToyWorldConfig(seed=1, n_train=600, n_dev=200, n_test=200,
                                                                      img_dim=32)).write)


def write_precomp(root, split, feats, captions, ids=None):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{split}_ims.npy", np.asarray(feats, dtype=np.float32))
    (root / f"{split}_caps.txt").write_text("\n".join(captions) + "\n", encoding="utf-8")
    if ids is not None:
        (root / f"{split}_ids.txt").write_text("\n".join(ids) + "\n")
    return root
