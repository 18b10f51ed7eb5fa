"""The package's functions take settings as values and keywords, and stay short enough to read: none in ``src/``
has more than 6 positional parameters (``self``/``cls`` not counted) or more than 120 lines."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_POSITIONAL, MAX_LINES = 6, 120


def functions(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def positional(fn: ast.FunctionDef) -> int:
    args = fn.args.posonlyargs + fn.args.args
    return len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)


def offenders(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for fn in functions(path.read_text()):
            where = f"{path.relative_to(root)}:{fn.lineno} {fn.name}"
            if positional(fn) > MAX_POSITIONAL:
                out.append(f"{where} takes {positional(fn)} positional parameters")
            if fn.end_lineno - fn.lineno + 1 > MAX_LINES:
                out.append(f"{where} is {fn.end_lineno - fn.lineno + 1} lines long")
    return out


def test_no_function_in_src_takes_too_many_positional_parameters_or_runs_too_long():
    assert offenders(SRC) == []


@pytest.mark.parametrize(("source", "found"), [
    ("def f(a, b, c, d, e, f, g):\n    pass\n", "takes 7 positional"),
    ("class C:\n    def m(self, a, b, c, d, e, f, g):\n        pass\n", "takes 7 positional"),
    ("def f():\n" + "    x = 1\n" * 120, "is 121 lines long"),
])
def test_the_check_bites(tmp_path, source, found):
    (tmp_path / "m.py").write_text(source)
    assert found in offenders(tmp_path)[0]


def test_keyword_only_parameters_and_self_do_not_count(tmp_path):
    (tmp_path / "m.py").write_text("class C:\n    def m(self, a, b, c, d, e, f, *, g, h):\n        pass\n")
    assert offenders(tmp_path) == []
