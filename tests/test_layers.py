"""The layers contract (``[tool.importlinter]`` in pyproject.toml, run by ``lint-imports`` in .ci/run) holds on
the package, and bites: on a copy of the package with one import that runs the wrong way, it fails and names it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "vlmatch"


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contract, on the ``vlmatch`` package found under ``src``."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=src, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


def copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package's sources with ``line`` appended to ``module`` (a path inside vlmatch/)."""
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "vlmatch", ignore=lambda d, names: [n for n in names if not (
        n.endswith(".py") or (Path(d) / n).is_dir()) or n == "__pycache__"])
    target = src / "vlmatch" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    return src


def test_the_package_keeps_every_contract():
    res = lint_imports(ROOT / "src")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize("module, line, contract, names", [
    # the upward import the layers issue removed: the protocol calling the engine that drives it
    ("models/base.py", "from ..evaluation.scoring import model_scores  # noqa", "models never import",
     "vlmatch.models.base -> vlmatch.evaluation.scoring"),
    # an input layer reaching into training
    ("data/vocab.py", "from ..training.config import load_config  # noqa", "layers:",
     "vlmatch.data.vocab -> vlmatch.training.config"),
    # library code importing the CLI (what explain.py and features/cli.py once did)
    ("viz/heatmap.py", "from ..cli.common import positive_int  # noqa", "layers:",
     "vlmatch.viz.heatmap -> vlmatch.cli.common"),
    # a cycle inside one layer: the loaders import precomp, so precomp may not import them
    ("data/precomp.py", "from . import loaders  # noqa", "no import cycles", ".precomp -> .loaders"),
    # the checkpoint room reaching up into the models that save and load through it
    ("checkpoints/read.py", "from ..models.calibration import attach_calibration  # noqa", "checkpoints never import",
     "vlmatch.checkpoints.read -> vlmatch.models.calibration"),
    # the seal, under read/write/digest inside the room, reading a folder itself
    ("checkpoints/seal.py", "from .read import read_config_json  # noqa", "checkpoints: read, write and digest above",
     "vlmatch.checkpoints.seal -> vlmatch.checkpoints.read"),
    # the package reaching into a room beside it (experiments/, benchmarks/, release/ use vlmatch, not the reverse)
    ("pretrained/card.py", "import release.check  # noqa", "vlmatch never imports experiments",
     "vlmatch.pretrained.card -> release"),
    # the package reaching for the rooms' helper package (src/vlmatch_lab: beside it in src/, no part of it)
    ("data/resolve.py", "from vlmatch_lab.paths import data_root  # noqa", "vlmatch never imports vlmatch_lab",
     "vlmatch.data.resolve -> vlmatch_lab"),
])
def test_an_import_the_wrong_way_breaks_the_contract(tmp_path, module, line, contract, names):
    res = lint_imports(copy_with(tmp_path, module, line))
    assert res.returncode == 1, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    broken = [ln for ln in res.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(contract in ln for ln in broken), res.stdout
    assert names in out, res.stdout
