"""The README's "which to use" table: a newcomer reads it in a minute (three short columns, no cell over 200
characters) and every figure in it is the registry's, itself checked against its results rows by
``release/ship.py --check`` (tests/release/test_check.py)."""

from __future__ import annotations

import re
from pathlib import Path

from vlmatch import pretrained

README = Path(__file__).resolve().parents[1] / "README.md"


def which_to_use() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    start = text.index("Which to use")
    lines = text[start:].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[first:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows


def test_the_table_is_three_short_columns():
    rows = which_to_use()
    assert rows[0] == ["for", "use", "val rsum"]
    assert len(rows) >= 4 and all(len(r) == 3 for r in rows)
    long = [c for r in rows for c in r if len(c) > 200]
    assert not long, f"cells over 200 characters: {long}"


def test_each_figure_is_its_shipped_models_registry_figure():
    by_name = {e.name: e for e in pretrained.entries()}
    checked = 0
    for use, figure in ((r[1], r[2]) for r in which_to_use()[2:]):
        names = re.findall(r"pretrained:([\w.-]+)", use)
        if figure == "-":
            continue
        assert names, f"a figure without a shipped model to check it against: {use!r}"
        entry = by_name[names[0]]
        want = entry.val["pair"]["rsum"] if "--score mean" in use else entry.val_rsum
        assert figure == f"{want:.1f}", f"{use}: the README says {figure}, the registry {want:.1f}"
        checked += 1
    assert checked >= 3
