"""Every figure the README and the docs quote in their prose comes from a results file the page links to.

A figure is a number with a decimal point or a percentage (``346.9``, ``75.5 %``) in a page's prose: outside code
blocks and code spans (commands, options and settings are written as code), outside the blocks a program writes
(``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``: the model table, the calibration paragraph) and outside HTML
comments. Its sources are the results the page links to (``results/X.md``, ``experiments/results/...``,
``benchmarks/results/...``, and the shipped models' page, which a program writes): the page itself (through its
``--8<--`` includes) and the data files beside it (``X.json``, ``X.csv``, the folders ``X/`` and ``X_*/``). A
figure is sourced when one of those files holds a number that rounds to it (a percentage also as a share: 75.5 %
from 0.755). A figure typed by hand, copied from a replaced model, worked out by hand or never measured is named
with its page and line (tests/release/test_figures.py runs this over every page). What it cannot see: a figure
miscopied into another number the same results also hold (a results page of many runs holds many numbers).

    python release/figures.py          # one line per unsourced figure; exit status 1 if there is any
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULT_ROOTS = (ROOT / "experiments" / "results", ROOT / "benchmarks" / "results")
DATA_SUFFIXES = (".json", ".csv", ".md")

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[^\n]*", re.M | re.S)
BLOCK = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
SPAN = re.compile(r"`[^`]+`")
VERSION = re.compile(r"\b(?:Python|PyTorch|torch|Milvus|milvus-lite|Pillow|CUDA) \d+(?:\.\d+)+")  # versions, not figures
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
FIGURE = re.compile(r"(?<![\w.,/])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?:\.\d+)?(?= ?%))(?![\w.]*\d)( ?%)?")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# pages a program writes whole from the registry (release/ship.py --card; --check compares them): a source too
GENERATED = (DOCS / "pretrained.md",)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"', re.M)


def pages() -> list[Path]:
    """The README and every docs page that is not only an include of a results file."""
    docs = [p for p in sorted(DOCS.rglob("*.md")) if not p.read_text(encoding="utf-8").lstrip().startswith("--8<--")]
    return [ROOT / "README.md", *docs]


def _blank(match: re.Match) -> str:
    """The matched text as blanks of the same lines (line numbers stay right)."""
    return "\n" * match.group(0).count("\n")


def prose(text: str) -> str:
    """A page's text with code, generated blocks, comments and link targets blanked out (line numbers kept)."""
    for pattern in (FENCE, SPAN, BLOCK, COMMENT, VERSION):  # spans first: one may show a marker
        text = pattern.sub(_blank, text)
    return LINK_TARGET.sub("]()", text)


def figure_spans(text: str) -> list[tuple[int, str, int]]:
    """(line number, figure, offset of the figure in the prose) of each figure of a page's prose (:func:`figures`)."""
    out, start = [], 0
    for n, line in enumerate(prose(text).split("\n"), 1):
        for m in FIGURE.finditer(line):
            num, pct = m.group(1), m.group(2)
            if "," in num and "." not in num and not pct:  # 1,000 photos: a count
                continue
            out.append((n, num + (pct or ""), start + m.start()))
        start += len(line) + 1
    return out


def figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) of each figure of a page's prose. Integers without a percent sign are counts (photos,
    queries, epochs), not figures; integers with thousands separators are counts too. A sign is not part of the
    figure (a difference's size is what a results file would hold); both ends of a range are figures."""
    return [(n, fig) for n, fig, _ in figure_spans(text)]


def _resolve(link: str, page: Path) -> Path | None:
    """The file a link of a page names, if it is a results file (docs/results pages resolved through their
    includes to the rooms' files)."""
    target = (page.parent / link.split("#")[0]).resolve()
    if not target.is_file() or target.suffix not in DATA_SUFFIXES:
        return None
    return target


def sources(page: Path) -> list[Path]:
    """The results files behind a page: the results it links to, their includes, and the data files beside them."""
    text = page.read_text(encoding="utf-8")
    found: list[Path] = []
    todo = [t for t in (_resolve(link, page) for link in LINK_TARGET.findall(COMMENT.sub("", text))) if t]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.append(path)
        body = path.read_text(encoding="utf-8", errors="replace") if path.suffix == ".md" else ""
        todo += [ROOT / inc for inc in INCLUDE.findall(body) if (ROOT / inc).is_file()]
        if path.suffix == ".md" and any(path.is_relative_to(r) for r in RESULT_ROOTS):
            stem = path.with_suffix("")
            todo += [path.with_suffix(s) for s in (".json", ".csv") if path.with_suffix(s).is_file()]
            for folder in (stem, *sorted(stem.parent.glob(stem.name + "_*"))):  # X/ and X_*/ (X_choices/ ...)
                if folder.is_dir():
                    todo += sorted(p for p in folder.rglob("*") if p.suffix in (".json", ".csv"))
    return [p for p in found if p.is_relative_to(ROOT) and (p.is_relative_to(DOCS / "results") or p in GENERATED
                                                            or any(p.is_relative_to(r) for r in RESULT_ROOTS))]


@cache
def file_values(path: Path) -> frozenset[float]:
    """Every number a results file holds."""
    return frozenset(float(x) for x in NUMBER.findall(path.read_text(encoding="utf-8", errors="replace")))


def _decimals(figure: str) -> int:
    num = figure.rstrip(" %")
    return len(num.split(".")[1]) if "." in num else 0


def sourced(figure: str, values: set[float]) -> bool:
    """Whether a number of ``values`` rounds to ``figure`` (a percentage also from a share)."""
    d = _decimals(figure)
    v = float(figure.rstrip(" %").replace(",", ""))
    scaled = (1.0, 100.0) if figure.endswith("%") else (1.0,)
    return any(abs(round(x * s, d) - v) < 1e-9 for x in values for s in scaled)


def page_values(page: Path) -> set[float]:
    return {x for p in sources(page) for x in file_values(p)}


def unsourced(page: Path) -> list[str]:
    """One line per figure of the page no linked results file holds."""
    values = page_values(page)
    rel = page.relative_to(ROOT).as_posix()
    return [f"{rel}:{n}: {fig} is in no results file the page links to"
            for n, fig in figures(page.read_text(encoding="utf-8")) if not sourced(fig, values)]


def main(argv: list[str] | None = None) -> int:
    problems = [line for page in pages() for line in unsourced(page)]
    for line in problems:
        print(line)
    print(f"{len(problems)} unsourced figure(s) in {len(pages())} pages", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
