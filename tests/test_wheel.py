"""The wheel ships the library alone: its top-level entries are ``vlmatch`` and its ``.dist-info``, never
``vlmatch_lab`` (the rooms' helpers, whose paths mean nothing once installed) nor the tests or the rooms. Built from
a copy of the checkout's packaging inputs, so no build/ or egg-info folder is left in the checkout."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/", 1)[0] for name in z.namelist()}


def copy_checkout(tmp: Path, pyproject: str) -> Path:
    """A copy of the checkout's packaging inputs, with ``pyproject`` as its pyproject.toml."""
    src = tmp / "checkout"
    src.mkdir()
    (src / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    for name in ("README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return src


def build(tmp: Path, pyproject: str) -> Path:
    """The wheel of a copy of the checkout (``pyproject`` as its pyproject.toml), built in ``tmp``."""
    src = copy_checkout(tmp, pyproject)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                           "-q", str(src), "-w", str(tmp / "wheel")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = (tmp / "wheel").glob("vlmatch-*.whl")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    return build(tmp_path_factory.mktemp("wheel"), (ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.mark.slow  # a wheel build
def test_the_wheel_holds_vlmatch_and_its_metadata_only(wheel):
    version = wheel.name.split("-")[1]
    assert (ROOT / "src" / "vlmatch_lab").is_dir()  # in the checkout, beside the library
    assert top_level(wheel) == {"vlmatch", f"vlmatch-{version}.dist-info"}


@pytest.mark.slow  # a wheel build
def test_the_wheel_keeps_the_package_data(wheel):
    """The include list names packages; the package data (registry, weights, page) still travels with them."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert "vlmatch/pretrained/registry.json" in names
    assert any(n.startswith("vlmatch/pretrained/weights/") for n in names)
    assert any(n.startswith("vlmatch/search/service/static/") for n in names)
    assert "vlmatch/cli/__init__.py" in names


@pytest.mark.slow  # a wheel build
def test_without_the_include_list_the_wheel_would_carry_the_rooms_helpers(tmp_path):
    """What the check above guards against: ``where = ["src"]`` alone packs every package under src/."""
    pytest.importorskip("setuptools")
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    line = 'include = ["vlmatch", "vlmatch.*"]\n'
    assert text.count(line) == 1
    assert "vlmatch_lab" in top_level(build(tmp_path, text.replace(line, "")))


def test_an_editable_install_still_puts_the_rooms_helpers_on_the_path(tmp_path):
    """``pip install -e .`` (the README's and CI's install) writes a .pth naming the whole src/ folder, so the tests
    and the rooms import vlmatch_lab from the checkout though the wheel leaves it out."""
    pytest.importorskip("setuptools")
    src = copy_checkout(tmp_path, (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    code = f"from setuptools import build_meta; print(build_meta.build_editable({str(tmp_path / 'out')!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "out" / done.stdout.split()[-1]) as z:
        (pth,) = [n for n in z.namelist() if n.endswith(".pth")]
        assert z.read(pth).decode().split() == [str(src / "src")]
