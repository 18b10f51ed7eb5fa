"""vlmatch.weights' meta builds: shapes without memory or initialisation, real builds inside them, and no
import of torch's compiler stack (which an initialiser on a meta tensor costs: seconds of a command's start)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import init

from vlmatch.weights import meta_build, real_build

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _initialised(t) -> bool:
    return bool(torch.isfinite(t).all()) and float(t.abs().sum()) > 0


def test_a_meta_build_skips_initialisers_and_a_real_build_inside_it_restores_them():
    probe = torch.zeros(3)
    with meta_build():
        lin = torch.nn.Linear(3, 4)
        assert lin.weight.is_meta
        assert init.ones_(probe) is probe and float(probe.sum()) == 0  # skipped in here
        with real_build():
            real = torch.nn.Linear(3, 4)
            assert not real.weight.is_meta and _initialised(real.weight)
            with meta_build():
                assert torch.nn.Embedding(5, 2).weight.is_meta
            assert _initialised(torch.nn.Linear(3, 4).weight)
        init.ones_(probe)
        assert float(probe.sum()) == 0
    init.ones_(probe)
    assert float(probe.sum()) == 3
    assert _initialised(torch.nn.Linear(3, 4).weight)


def test_a_failed_meta_build_leaves_initialisers_working():
    try:
        with meta_build():
            raise RuntimeError("a model whose construction needs real tensors")
    except RuntimeError:
        pass
    assert _initialised(torch.nn.Linear(3, 4).weight)


def test_another_thread_initialises_as_usual_while_one_is_in_a_meta_build():
    import threading

    inside, done = threading.Event(), threading.Event()
    built = {}

    def meta_side():
        with meta_build():
            built["meta"] = torch.nn.Linear(3, 4)
            inside.set()
            done.wait(timeout=30)

    t = threading.Thread(target=meta_side)
    t.start()
    assert inside.wait(timeout=30)
    try:
        other = torch.nn.Linear(64, 64)  # this thread is not in the meta build: its weights are drawn
        assert not other.weight.is_meta and _initialised(other.weight) and float(other.weight.std()) > 0.01
    finally:
        done.set()
        t.join()
    assert built["meta"].weight.is_meta


@pytest.mark.slow  # python in a process of its own
def test_a_meta_build_of_the_usual_layers_imports_no_compiler_stack():
    code = ("import sys, json, torch\nfrom vlmatch.weights import meta_build\nwith meta_build():\n"
            "    m = torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.Linear(4, 4), "
            "torch.nn.LayerNorm(4), torch.nn.GRU(4, 4, batch_first=True), torch.nn.BatchNorm1d(4))\n"
            "print(json.dumps([k for k in ('torch._dynamo', 'sympy') if k in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_torch_init_is_torchs_own_outside_a_meta_build():
    """Importing vlmatch, or loading a model with it, leaves torch.nn.init as torch made it; the switches are
    there only while a meta build runs."""
    from torch.nn import init

    import vlmatch  # noqa: F401

    before = {n: getattr(init, n) for n in ("uniform_", "normal_", "kaiming_uniform_", "xavier_uniform_")}
    assert not any(getattr(f, "vlmatch_switched", False) for f in before.values())
    with meta_build():
        assert getattr(init.kaiming_uniform_, "vlmatch_switched", False)
        with meta_build():
            pass
        assert getattr(init.kaiming_uniform_, "vlmatch_switched", False)  # the outer build still runs
    assert {n: getattr(init, n) for n in before} == before
