"""The seams between the rooms (experiments/, benchmarks/, release/): each imports vlmatch and vlmatch_lab, never another
room through sys.path; their caches live under the one cache root and their data under the data root, so no file of
theirs writes a machine's layout (``benchmarks/cache``, ``../shared``)."""

import ast
import re

import pytest

from tests.benchmark_scripts import ROOMS, ROOT

SCRIPTS = sorted(p for room in ROOMS for p in room.glob("*.py"))
# where the rooms' caches and data are told about: their code, their pages, the recipes, the docs
TEXTS = sorted([*SCRIPTS, *(room / "README.md" for room in ROOMS), ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "experiments" / "recipes").rglob("*.yaml")])


def _name(p) -> str:
    return p.relative_to(ROOT).as_posix()


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) > 30 and {p.parent.name for p in SCRIPTS} == {"experiments", "benchmarks", "release"}


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_no_room_reaches_another_through_sys_path(script):
    text = script.read_text(encoding="utf-8")
    edits = re.findall(r"sys\.path\s*(?:\.\s*(?:insert|append|extend|remove|pop|clear)\b|(?:\[[^]\n]*\])?\s*[+]?=(?!=))",
                       text)
    assert not edits, f"{_name(script)}: {edits[0]!r}: import vlmatch_lab (the Milvus test server: vlmatch_lab.milvus_server)"


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_no_script_writes_where_the_cache_or_the_data_lie(script):
    """Every location goes through vlmatch_lab.paths (cache_root(), data_root()): no path component "cache" or
    "shared", no "../shared/..." string."""
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value
            assert s not in ("cache", "shared") and not s.startswith(("../shared", "shared/", "benchmarks/cache")), (
                f"{_name(script)}:{node.lineno}: {s!r}: use vlmatch_lab.paths")


@pytest.mark.parametrize("path", TEXTS, ids=_name)
def test_no_page_or_recipe_sends_anyone_to_benchmarks_cache(path):
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if "benchmarks/cache" in ln]
    if path.suffix == ".yaml":  # a recipe's recorded command is history: it ran when the cache was there
        lines = [ln for ln in lines if not ln.startswith(("  recorded:", "    "))]
    assert not lines, f"{_name(path)}: $VLMATCH_CACHE is the rooms' cache: {lines[0].strip()}"
