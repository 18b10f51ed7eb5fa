"""A benchmark's result file pair: the JSON record and its Markdown rendering, side by side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def write_report(out: str | Path, report: dict, render: Callable[[dict], str]) -> None:
    """``out``.json (the record) and ``out``.md (``render(report)``), each written whole or not at all."""
    from vlmatch.io import write_json, write_text

    write_json(Path(out).with_suffix(".json"), report)
    write_text(Path(out).with_suffix(".md"), render(report))
    print(f"wrote {out}.json and .md")
