"""A tiny deterministic backbone and folders of small JPEGs for index-build tests, and a child process
that runs ``vlmatch`` with them (the crash and lock tests):

    python -m tests.search.tiny [--kill-at STEP[@N]] [--gate FILE] -- index build ...

``--kill-at``: the child dies (``os._exit(9)``, no cleanup of any kind) at the N-th (default first)
call of :data:`vlmatch.io.crash_hook` with STEP; ``--gate``: before encoding its first batch it
creates FILE.waiting and waits (at most a minute) until FILE exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vlmatch
from vlmatch.features import backbones
from vlmatch.features.backbones import Backbone, BackboneInfo

ROOT = Path(__file__).resolve().parents[2]


class Tiny32(Backbone):
    """A deterministic stand-in backbone: 2 x 2 grid of 32-d features (quadrant colours, projected)."""

    images = 0  # images seen by every instance (the tests count re-encoding with it)
    fail_after: int | None = None  # raise (a simulated kill) once this many images were seen
    before_batch = None  # called with no argument before each batch is encoded (its files are read by then)

    def __init__(self, weights=None):
        super().__init__()
        self.info = BackboneInfo("tiny32", 8, 2, 32, "pixel / 255")
        self.proj = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))

    def _normalise(self, x):
        return x / 255.0

    def feature_map(self, x):
        if Tiny32.before_batch is not None:
            Tiny32.before_batch()
        if Tiny32.fail_after is not None and Tiny32.images + len(x) > Tiny32.fail_after:
            raise KeyboardInterrupt("simulated kill")
        Tiny32.images += len(x)
        q = torch.nn.functional.avg_pool2d(x, 4)  # (B, 3, 2, 2)
        return torch.einsum("bchw,cd->bdhw", q, self.proj)


@pytest.fixture(autouse=True)
def tiny_backbone(monkeypatch):
    monkeypatch.setitem(backbones.BACKBONES, "tiny32", Tiny32)
    Tiny32.images, Tiny32.fail_after, Tiny32.before_batch = 0, None, None


def jpegs(folder, names, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for n in names:
        (folder / n).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)).save(folder / n)
    return folder


def build_args(model, images, out, *extra, retriever=None) -> list[str]:
    return ["index", "build", "--model", str(model), "--retriever", str(retriever), "--images", str(images),
            "--out", str(out), "--backbone", "tiny32", "--no-progress", "--batch-size", "2", *extra]


class Scores(dict):
    """Path -> score; equal to another when the paths are the same and every score agrees within 1e-5:
    an image encoded in another batch (an update's two new images, a full build's nine) lands elsewhere
    in the last bits on CPUs whose GEMM kernels block by the batch size (AVX-512 oneDNN)."""

    def __eq__(self, other):
        return (isinstance(other, dict) and self.keys() == other.keys()
                and all(abs(v - other[k]) <= 1e-5 for k, v in self.items()))

    __hash__ = None


def exhaustive(index_dir, q="a red dog"):
    idx = vlmatch.Index.open(index_dir)
    return Scores({r.path: r.score for r in idx.search(q, k=len(idx), candidates=len(idx))})


def child(args: list[str], kill_at: str | None = None, gate: Path | None = None) -> subprocess.Popen:
    """``vlmatch ARGS`` in a child process with Tiny32 registered (see the module doc)."""
    opts = (["--kill-at", kill_at] if kill_at else []) + (["--gate", str(gate)] if gate else [])
    src = str(Path(vlmatch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.search.tiny", *opts, "--", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_child(args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    p = child(args, kill_at)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _main(argv: list[str]) -> int:
    from vlmatch import io
    from vlmatch.cli import main

    split = argv.index("--")
    opts, args = dict(zip(argv[:split:2], argv[1:split:2], strict=True)), argv[split + 1:]
    backbones.BACKBONES["tiny32"] = Tiny32
    torch.set_num_threads(1)
    if "--kill-at" in opts:
        step, _, nth = opts["--kill-at"].partition("@")
        seen = []

        def hook(name):
            if name == step:
                seen.append(name)
                if len(seen) == int(nth or 1):
                    os._exit(9)

        io.crash_hook = hook
    if "--gate" in opts:
        gate = Path(opts["--gate"])

        def wait_at_gate():
            Tiny32.before_batch = None
            gate.with_name(gate.name + ".waiting").touch()
            t0 = time.monotonic()
            while not gate.exists():
                if time.monotonic() - t0 > 60:
                    raise RuntimeError(f"{gate} never appeared")
                time.sleep(0.02)

        Tiny32.before_batch = wait_at_gate
    return main(args)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
