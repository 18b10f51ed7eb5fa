"""Each figure the README and the docs quote in prose is tied to one source: a results file and a key in it.

The ties are listed in one place, ``release/figure_sources.json``: for each page, one entry per figure, in page order,
``{"at": the words just before the figure, "source": "FILE#KEY"}``. ``FILE`` is a path from the checkout's root (a
results file the page links to; for a page that links a page the registry writes -- docs/pretrained.md -- also
``src/vlmatch/pretrained/registry.json``); ``KEY`` is the value's path in it: dotted keys, ``[i]`` for a list item or
``[NAME]`` for the item of a list whose ``name`` is NAME (the registry's entries), and for a CSV file ``ROW.COLUMN``
(ROW: the first column's value); for a Markdown results page, the words just before the number in
it (the first number after them is the value). A number that is not a measurement (a section number, a version)
is tied to ``{"at": ..., "none": "why"}``. ``at`` is the last words of prose before the figure, with every other figure written
``#`` (so a neighbour's edit does not lose the tie). The check compares the figure with exactly that value, rounded
as the figure is written (a percentage also from a share); a figure with no tie, a tie whose words are no longer on
the page, a key its file no longer holds and a file the page does not link are problems too.

    python release/figure_sources.py            # one line per problem; exit status 1 if there is any
    python release/figure_sources.py --bind     # tie each untied figure to a key that holds it, and say which
                                                # were chosen among several (check those by hand: "among": N)
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from functools import cache
from pathlib import Path

import figures as F

ROOT = F.ROOT
TABLE = Path(__file__).resolve().parent / "figure_sources.json"
REGISTRY = ROOT / "src" / "vlmatch" / "pretrained" / "registry.json"
CONTEXT = 48  # characters of prose before a figure that name its place on the page
WINDOW = 400


def context(prose: str, offset: int) -> str:
    """The words before the figure at ``offset``: other figures as ``#``, whitespace collapsed, the last CONTEXT."""
    before = F.FIGURE.sub("#", prose[max(0, offset - WINDOW):offset])
    return " ".join(before.split())[-CONTEXT:]


def _leaves(obj, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        names = [v.get("name") if isinstance(v, dict) else None for v in obj]
        named = all(isinstance(n, str) for n in names) and len(set(names)) == len(names)
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{names[i] if named else i}]")
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield path, float(obj)


@cache
def keyed_values(path: Path) -> dict[str, float]:
    """Every number of a JSON or CSV file by its key (module docstring); {} for other files."""
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    if path.suffix == ".json":
        try:
            return dict(_leaves(json.loads(text)))
        except ValueError:
            return {}
    if path.suffix != ".csv":
        return {}
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        return {}
    head, body = rows[0], rows[1:]
    firsts = [r[0] if r else "" for r in body]
    out = {}
    for i, r in enumerate(body):
        label = firsts[i] if firsts.count(firsts[i]) == 1 and firsts[i] else str(i)
        for col, cell in zip(head, r, strict=False):
            try:
                out[f"{label}.{col}"] = float(cell)
            except ValueError:
                pass
    return out


def source_value(path: Path, key: str) -> float | None:
    """The value ``key`` names in ``path`` (module docstring), or None."""
    if path.suffix != ".md":
        return keyed_values(path).get(key)
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() and key else ""
    at = text.find(key)
    m = F.NUMBER.search(text, at + len(key)) if at >= 0 else None
    return float(m.group(0)) if m else None


def md_anchors(path: Path, fig: str) -> list[str]:
    """Anchors (the words before it on its line, unique in the file) of each number of a Markdown file that rounds
    to ``fig``."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out = []
    for m in F.NUMBER.finditer(text):
        if not F.sourced(fig, {float(m.group(0))}):
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        for width in (24, 40, 80):
            anchor = text[max(line_start, m.start() - width):m.start()]
            if anchor.strip() and text.count(anchor) == 1:
                out.append(anchor)
                break
    return out


@cache
def linked(page: Path) -> list[Path]:
    """The files a page's figures may be tied to: the results it links (release/figures.py's sources), and the
    registry when it links a page the registry writes."""
    found = F.sources(page)
    return found + ([REGISTRY] if any(p in F.GENERATED for p in found) else [])


def read_table(table: Path | None = None) -> dict[str, list[dict]]:
    table = TABLE if table is None else table
    if not table.is_file():
        return {}
    try:
        data = json.loads(table.read_text(encoding="utf-8"))
    except ValueError as e:
        raise SystemExit(f"{table.name}: not JSON ({e})") from None
    return data


def _ties(page: Path, entries: list[dict], text: str | None = None):
    """(line, figure, at, entry or None) for each figure of ``page`` (or of ``text`` read as that page), and the
    entries no figure took."""
    text = page.read_text(encoding="utf-8") if text is None else text
    prose = F.prose(text)
    free: dict[str, list[dict]] = {}
    for e in entries:
        free.setdefault(e.get("at", ""), []).append(e)
    out = []
    for line, fig, offset in F.figure_spans(text):
        at = context(prose, offset)
        out.append((line, fig, at, free[at].pop(0) if free.get(at) else None))
    return out, [e for left in free.values() for e in left]


def page_problems(page: Path, table: dict | None = None, text: str | None = None) -> list[str]:
    """One line per figure of ``page`` (or of ``text`` read as that page) that is not exactly its one source's value
    (module docstring)."""
    rel = page.relative_to(ROOT).as_posix()
    ties, stale = _ties(page, (read_table() if table is None else table).get(rel, []), text)
    files = set(linked(page))
    out = []
    for line, fig, at, entry in ties:
        where = f"{rel}:{line}: {fig}"
        if entry is None:
            out.append(f"{where} is tied to no source (after \"{at}\"): python release/figure_sources.py --bind")
            continue
        if "none" in entry:  # not a measurement: said so in the table
            continue
        name, _, key = entry.get("source", "").partition("#")
        path = ROOT / name
        value = source_value(path, key)
        if path not in files:
            out.append(f"{where}: its source {name} is not a results file the page links to")
        elif value is None:
            out.append(f"{where}: its source {name} holds no {key}")
        elif not F.sourced(fig, {value}):
            out.append(f"{where} is not {name}#{key} ({value:g})")
    out += [f"{rel}: the tie after \"{e.get('at')}\" ({e.get('source')}) names no figure on the page" for e in stale]
    return out


def problems(table: dict | None = None) -> list[str]:
    table = read_table() if table is None else table
    pages = F.pages()
    rels = {p.relative_to(ROOT).as_posix() for p in pages}
    return ([p for page in pages for p in page_problems(page, table)]
            + [f"{TABLE.name}: {rel} is not a page of the README and docs" for rel in table if rel not in rels])


@cache
def _link_spans(page: Path) -> list[tuple[int, set[Path]]]:
    """(offset, the files behind it) of each results link of a page (for choosing among candidates by nearness)."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in F.LINK_TARGET.finditer(text):
        target = F._resolve(m.group(1), page)
        if target is not None:
            out.append((m.start(), {target, *_behind(target)}))
    return out


def _behind(path: Path) -> set[Path]:
    body = path.read_text(encoding="utf-8", errors="replace") if path.suffix == ".md" else ""
    found = {ROOT / inc for inc in F.INCLUDE.findall(body) if (ROOT / inc).is_file()}
    stem = path.with_suffix("")
    found |= {path.with_suffix(s) for s in (".json", ".csv") if path.with_suffix(s).is_file()}
    for inc in list(found):
        found |= {inc.with_suffix(s) for s in (".json", ".csv") if inc.with_suffix(s).is_file()}
    if stem.is_dir():
        found |= {p for p in stem.rglob("*") if p.suffix in (".json", ".csv")}
    return found | ({REGISTRY} if path in F.GENERATED else set())


WORD = re.compile(r"[a-z]+\d*")


def candidates(page: Path, fig: str, offset: int, words: str = "") -> list[str]:
    """Every FILE#KEY of the page's linked results that holds ``fig``: first the keys that share most words with
    the prose before the figure (``words``), then the files of the links nearest the figure (in the raw page, which
    keeps the prose's offsets only roughly), then the values closest to the figure. A ranking, not a proof: a tie
    chosen among several is marked ``among`` for a reader to confirm. Markdown pages only when no JSON or CSV holds
    it."""
    near = sorted(_link_spans(page), key=lambda ls: abs(ls[0] - offset))
    rank = {}
    for i, (_, files) in enumerate(near):
        for f in files:
            rank.setdefault(f, i)
    said = set(WORD.findall(words.lower()))
    num = float(fig.rstrip(" %").replace(",", ""))
    scored = []
    for path in linked(page):
        rel = path.relative_to(ROOT).as_posix()
        for k, v in keyed_values(path).items():
            if F.sourced(fig, {v}):
                err = min(abs(v * s - num) for s in ((1.0, 100.0) if fig.endswith("%") else (1.0,)))
                overlap = len(said & set(WORD.findall(k.lower())))
                scored.append(((-overlap, rank.get(path, len(near)), err, rel), f"{rel}#{k}"))
    if not scored:
        for path in linked(page):
            if path.suffix == ".md":
                rel = path.relative_to(ROOT).as_posix()
                scored += [((0, rank.get(path, len(near)), 0.0, rel), f"{rel}#{a}") for a in md_anchors(path, fig)]
    return [c for _, c in sorted(scored, key=lambda t: t[0])]


def bind(table: dict) -> tuple[dict, list[str]]:
    """``table`` with a tie for each untied figure (the first candidate), and a line for each figure tied so."""
    said = []
    for page in F.pages():
        rel = page.relative_to(ROOT).as_posix()
        old = table.get(rel, [])
        ties, _ = _ties(page, [dict(e) for e in old])
        text = page.read_text(encoding="utf-8")
        offsets = [o for _, _, o in F.figure_spans(text)]
        new = []
        for (line, fig, at, entry), offset in zip(ties, offsets, strict=True):
            if entry is None:
                found = candidates(page, fig, offset, F.prose(text)[max(0, offset - 160):offset])
                if not found:
                    said.append(f"{rel}:{line}: {fig}: no linked JSON or CSV holds it; tie it by hand")
                    continue
                entry = {"at": at, "source": found[0], **({"among": len(found)} if len(found) > 1 else {})}
                said.append(f"{rel}:{line}: {fig} -> {found[0]}" + (f" (among {len(found)})" if len(found) > 1 else ""))
            new.append(entry)
        if new:
            table[rel] = new
    return table, said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bind", action="store_true", help="tie each untied figure to a key that holds it")
    a = ap.parse_args(argv)
    if a.bind:
        table, said = bind(read_table())
        TABLE.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print("\n".join(said) or "every figure was already tied")
        return 0
    found = problems()
    print("\n".join(found) or "every figure of the README and docs is its one source's value")
    print(unconfirmed(read_table()), file=sys.stderr)
    return 1 if found else 0


def unconfirmed(table: dict) -> str:
    """How many ties --bind chose among several keys holding the same value (``among``), for a writer to confirm (a
    tie to the wrong one of two equal values holds the figure today, but will not follow its own source's change)."""
    ties = [e for entries in table.values() for e in entries]
    n = sum("among" in e for e in ties)
    return f"{n} of {len(ties)} ties were chosen by --bind among several keys of the same value (\"among\"): confirm them"


if __name__ == "__main__":
    sys.exit(main())
