"""vlmatch.weights' meta builds: shapes without memory or initialisation, real builds inside them, and no
import of torch's compiler stack (which an initialiser on a meta tensor costs: seconds of a command's start)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn import init

from vlmatch.weights import meta_build, real_build

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_a_meta_build_skips_initialisers_and_a_real_build_inside_it_restores_them():
    before = init.normal_
    with meta_build():
        lin = torch.nn.Linear(3, 4)
        assert lin.weight.is_meta and init.normal_ is not before
        with real_build():
            assert init.normal_ is before
            real = torch.nn.Linear(3, 4)
            assert not real.weight.is_meta and bool(torch.isfinite(real.weight).all()) and real.weight.abs().sum() > 0
            with meta_build():
                assert torch.nn.Embedding(5, 2).weight.is_meta
            assert init.normal_ is before
        assert init.normal_ is not before
    assert init.normal_ is before


def test_a_meta_build_of_the_usual_layers_imports_no_compiler_stack():
    code = ("import sys, json, torch\nfrom vlmatch.weights import meta_build\nwith meta_build():\n"
            "    m = torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.Linear(4, 4), "
            "torch.nn.LayerNorm(4), torch.nn.GRU(4, 4, batch_first=True), torch.nn.BatchNorm1d(4))\n"
            "print(json.dumps([k for k in ('torch._dynamo', 'sympy') if k in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
