"""The documentation site holds together: every page is reachable, every README link lands, the results
pages include the benchmark files (no copy that goes stale), and user docs say nothing about one machine.

The site itself is built with ``mkdocs build --strict`` in CI (``.ci/run``) and here when mkdocs is
installed (extra ``docs``); the code blocks of every page run in tests/test_readme.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = (ROOT / "benchmarks" / "results", ROOT / "experiments" / "results")  # the rooms' results
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
MARKERS = ("<!-- pretrained-table:begin -->", "<!-- pretrained-table:end -->")  # the full card (docs/pretrained.md)
SUMMARY = ("<!-- pretrained-summary:begin -->", "<!-- pretrained-summary:end -->")  # the README's table


def nav_pages(node) -> list[str]:
    """Every page path named in mkdocs.yml's nav (nested sections included)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in nav_pages(v)]
    if isinstance(node, list):
        return [p for v in node for p in nav_pages(v)]
    return []


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def slugify(value: str) -> str:
    """Python-Markdown's toc slugify (what mkdocs uses for heading ids)."""
    value = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", value).strip().lower())


def anchors(page: Path) -> set[str]:
    """The heading ids mkdocs gives a page (the toc extension's slugify), code blocks excluded."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slugify(re.sub(r"[`*]", "", m.group(2))) for m in HEADING.finditer(text)}


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(mkdocs_config()["nav"])
    assert sorted(set(nav)) == PAGES, {"not in nav": sorted(set(PAGES) - set(nav)),
                                       "in nav but missing": sorted(set(nav) - set(PAGES))}
    assert len(nav) == len(set(nav)), "a page is listed twice in nav"


def test_every_model_has_a_page_that_pulls_its_module_docstring():
    for module in ("vse", "scan", "caan", "sman", "mtfn", "mmca"):
        page = "vsepp.md" if module == "vse" else f"{module}.md"
        text = (DOCS / "models" / page).read_text(encoding="utf-8")
        assert f"::: vlmatch.models.{module}\n" in text, page


def test_every_readme_link_to_the_docs_resolves():
    links = [u for u in LINK.findall(README.read_text(encoding="utf-8")) if u.startswith("docs/")]
    assert len(links) >= 10, links
    for url in links:
        path, _, anchor = url.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {url}: no such file"
        if target.suffix == ".md":
            assert target.relative_to(DOCS).as_posix() in PAGES, url
            assert not anchor or anchor in anchors(target), f"README links to {url}: no heading with that id"


def test_every_benchmark_result_is_included_in_the_site():
    included = set()
    for page in DOCS.rglob("*.md"):
        included |= set(re.findall(r'^--8<-- "([^"]+)"', page.read_text(encoding="utf-8"), re.M))
    for result in sorted(p for room in RESULTS for p in room.glob("*.md")):
        assert result.relative_to(ROOT).as_posix() in included, f"{result.name} is on no docs page"
    for path in included:
        assert (ROOT / path).is_file(), path


def test_readme_keeps_its_first_commands_and_the_shipped_model_markers():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "the README is a front page: the rest belongs in docs/"
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert [ln.split("#")[0].strip() for ln in first.splitlines()] == ["vlmatch quickstart", "python -m pytest -q"]
    assert "vlmatch index build --images ~/Pictures --out my-index" in text
    assert 'vlmatch search my-index "a dog running on the beach"' in text
    for doc, (a, b) in ((text.split("## Shipped models", 1)[1], SUMMARY),
                        ((DOCS / "pretrained.md").read_text(encoding="utf-8"), MARKERS)):
        begin, end = doc.index(a), doc.index(b)
        assert begin < end and "| name |" in doc[begin:end]


@pytest.mark.parametrize("phrase", ["this machine", "this project's", "../shared", "2-core", "2 CPU cores",
                                    "EPYC", "shared CPU"])
def test_user_docs_say_nothing_about_one_machine(phrase):
    """The README and docs/ pages (not the benchmark files they include: those record their host)."""
    for page in [README, *DOCS.rglob("*.md")]:
        text = page.read_text(encoding="utf-8")
        assert phrase.lower() not in text.lower(), f"{page.relative_to(ROOT)} mentions {phrase!r}"


@pytest.mark.slow  # builds the whole site with mkdocs
def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "models" / "scan" / "index.html").is_file()
