"""Cold start (issue #50): the command line's parser, ``vlmatch --help`` and every command's argument
errors import no torch, numpy, transformers, faiss or fastapi (each command imports what it needs when it
runs). Checked through ``sys.modules`` of a fresh interpreter; the times are benchmarks/cold_start.py's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "numpy", "transformers", "faiss", "fastapi", "safetensors", "PIL", "tokenizers")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _heavy_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; which HEAVY modules it imported, and its exit status."""
    probe = (f"import sys, json\ntry:\n    {code}\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
             f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules], 'code': code}}), "
             "file=sys.__stderr__)")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1])


def test_building_the_parser_imports_no_torch():
    got = _heavy_after("import vlmatch.cli; vlmatch.cli.build_parser()")
    assert got == {"heavy": [], "code": 0}


@pytest.mark.parametrize("argv", [
    ["--help"], ["search", "--help"], ["index", "build", "--help"], ["explain", "--help"], ["train", "--help"],
    ["serve", "--help"], ["evaluate", "--help"], ["pretrained", "--help"],
    ["search", "IDX", "text", "-k", "x"],            # a value argparse refuses
    ["explain", "--out", "x.png"],                    # a required argument missing
    ["index", "build", "--model", "pretrained:nope"],  # an unknown shipped model, refused by the argument's type
    ["nosuchcommand"],
])
def test_help_and_argument_errors_import_no_torch(argv):
    got = _heavy_after(f"import vlmatch.cli; vlmatch.cli.main({argv!r})")
    assert got["heavy"] == []
    assert got["code"] == (0 if "--help" in argv else 2)


@pytest.mark.slow  # python in a process of its own
def test_the_package_imports_no_torch_until_a_model_is_asked_for():
    got = _heavy_after("import vlmatch, vlmatch.models, vlmatch.search, vlmatch.checkpoints.read")
    assert got == {"heavy": [], "code": 0}
    got = _heavy_after("import vlmatch; vlmatch.create_model")  # the public names still work, imported on use
    assert "torch" in got["heavy"]


def test_the_constants_the_parser_spells_out_equal_their_modules():
    from vlmatch.cli import explain, search, similar
    from vlmatch.evaluation import explainers
    from vlmatch.search import job, stage1
    from vlmatch.search.library import duplicates
    from vlmatch.search.library import similar as similar_search

    assert explain.METHODS == explainers.METHODS
    assert search.SCORES == job.SCORES and search.KINDS == stage1.KINDS
    assert similar.DEFAULT_TEXT_WEIGHT == similar_search.DEFAULT_TEXT_WEIGHT
    assert (similar.DEFAULT_THRESHOLD, similar.DEFAULT_NEIGHBOURS) == (duplicates.DEFAULT_THRESHOLD,
                                                                       duplicates.DEFAULT_NEIGHBOURS)


def test_every_commands_help_and_a_missing_argument_import_no_torch():
    code = """
import argparse, contextlib, io
import vlmatch.cli as cli

def commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from commands(sub, prefix + (name,))

seen = []
for argv in commands(cli.build_parser()):
    for extra in (["--help"], ["--no-such-flag"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main([*argv, *extra])
            except SystemExit:
                pass
    seen.append(" ".join(argv))
assert len(seen) >= 20, seen
"""
    got = _heavy_after("exec(" + repr(code) + ")")
    assert got == {"heavy": [], "code": 0}
