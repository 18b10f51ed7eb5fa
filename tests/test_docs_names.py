"""The names the docs give are names the code has: every ``--flag`` in a page's code (inline code and code blocks),
every JSON field of the HTTP API's tables and every registry field a page points at. A renamed flag, field or
registry key fails here until the page follows (tests/test_readme.py runs the pages' bash blocks; this covers the
inline code and the other blocks too).

* Flags: in a ``vlmatch SUB ...`` command (or ``-m vlmatch.cli SUB``, or a span that starts with a command, such
  as ``index build --score mean``), each flag must be an option of that command; in ``python ROOM/SCRIPT.py ...`` an
  option the script declares; a flag on its own an option of some vlmatch command or of some script of the rooms.
  Other programs' flags (pip, pytest, mkdocs, torchrun, ...) are theirs.
* JSON fields: each table of docs/http-api.md whose first column is ``field`` lists exactly the fields of the
  service's model named in backticks just above it (vlmatch.search.service.schema).
* Registry fields: a name in backticks right after "the registry's", "registry record" or "record says" / "record's"
  is a key of the shipped registry (vlmatch/pretrained/registry.json), a dotted path read from an entry down.

The results pages (docs/results/) only include the rooms' results files, whose recorded commands are history.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from vlmatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "results" not in p.relative_to(DOCS).parts)]
ROOMS = ("experiments", "benchmarks", "release")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"^\[?(--[a-z][a-z0-9_-]*)")
# other programs whose flags a page may show
EXTERNAL = {"pip", "pip3", "pytest", "mkdocs", "torchrun", "curl", "uvicorn", "git", "apt-get", "bash", "sudo", "ruff",
            "lint-imports", "playwright", "docker", "helm", "nvidia-smi", "flock", "wget", "tar", "ls", "du", "time"}
REGISTRY_NAME = re.compile(r"(?:registry's|registry record|record says|record's)\s*\(?`([^`\n]+)`")
IDENT = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*)(?::\s.*)?$")


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# --- CLI flags ------------------------------------------------------------------------------------------------------

@cache
def commands() -> dict[tuple[str, ...], frozenset[str]]:
    """Every vlmatch command path (() the top level) -> its options and its parents' (``--debug`` anywhere)."""
    out: dict[tuple[str, ...], frozenset[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...], inherited: frozenset[str]) -> None:
        own = inherited | {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
        out[path] = own
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name), inherited | {"--debug"})

    walk(build_parser(), (), frozenset())
    return out


@cache
def script_flags(script: str) -> frozenset[str]:
    """The options a room's script declares (its quoted ``"--name"`` strings)."""
    return frozenset(re.findall(r"[\"'](--[a-z][a-z0-9_-]*)[\"'=]", (ROOT / script).read_text(encoding="utf-8")))


@cache
def any_flag() -> frozenset[str]:
    rooms = [p.relative_to(ROOT).as_posix() for room in ROOMS for p in (ROOT / room).glob("*.py")]
    return frozenset().union(*commands().values(), *(script_flags(s) for s in rooms))


def flags_of(words: list[str]) -> list[str]:
    return [m.group(1) for w in words if (m := FLAG.match(w))]


def command_path(words: list[str]) -> tuple[str, ...]:
    """The longest vlmatch command path at the head of ``words``."""
    path: tuple[str, ...] = ()
    for w in words:
        if (*path, w) not in commands():
            break
        path = (*path, w)
    return path


def segments(text: str) -> list[list[str]]:
    """The words of each command of a line or span (split at ``&&``, ``;``, ``|``), comments dropped."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in prose
        words = text.split()
    out, cur = [], []
    for w in [*words, "&&"]:
        if w in ("&&", ";", "|", "||"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out


def flag_problems(text: str) -> list[str]:
    """The flags of a line or span of code that its command does not have."""
    problems = []
    for words in segments(text):
        while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in ("$", "env")):
            words = words[1:]  # VAR=value before a command
        if not words:
            continue
        if "vlmatch" in words or "vlmatch.cli" in words:
            argv = words[words.index("vlmatch" if "vlmatch" in words else "vlmatch.cli") + 1:]
            path = command_path(argv)
            known, where = commands()[path], "vlmatch " + " ".join(path)
        elif (script := next((w for w in words if w.endswith(".py") and w.split("/")[0] in ROOMS
                              and (ROOT / w).is_file()), None)):
            argv, known, where = words[words.index(script) + 1:], script_flags(script) | {"--help"}, script
        elif Path(words[0]).name in EXTERNAL or words[:3] == ["python", "-m", "pytest"] or words[0] == "pip":
            continue
        elif command_path(words):
            path = command_path(words)
            argv, known, where = words, commands()[path], "vlmatch " + " ".join(path)
        else:
            argv, known, where = words, any_flag(), "any vlmatch command or script of the rooms"
        problems += [f"{flag} (not an option of {where})" for flag in flags_of(argv) if flag not in known]
    return problems


def code_pieces(text: str) -> list[str]:
    """Each logical line of the page's code blocks (continuations joined) and each inline code span outside them."""
    out = []
    for m in FENCE.finditer(text):
        logical = ""
        for line in m.group(1).splitlines():
            logical += line.rstrip()
            if logical.endswith("\\"):
                logical = logical[:-1] + " "
                continue
            out.append(logical)
            logical = ""
        if logical:
            out.append(logical)
    out += SPAN.findall(FENCE.sub("", text))
    return out


def page_flag_problems(text: str) -> list[str]:
    return [f"`{piece.strip()[:80]}`: {p}" for piece in code_pieces(text) if "--" in piece
            for p in flag_problems(piece)]


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_flag_a_page_names_is_an_option_of_its_command(page):
    assert not page_flag_problems(page.read_text(encoding="utf-8")), page_name(page)


def test_the_pages_name_flags_to_check():
    found = [f for p in PAGES for piece in code_pieces(p.read_text(encoding="utf-8")) for f in flags_of(piece.split())]
    assert len(found) > 200 and {"--retriever", "--no-open-vocab", "--mirror"} <= set(found)


# --- JSON fields of the HTTP API -----------------------------------------------------------------------------------

def schema_models() -> dict[str, set[str]]:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel

    from vlmatch.search.service import schema

    return {name: set(obj.model_fields) for name, obj in vars(schema).items()
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj is not BaseModel}


def field_tables(text: str) -> list[tuple[str, set[str]]]:
    """(the model named in backticks nearest above, the fields of its first column) of every ``| field |`` table."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"^\|\s*field\s*\|", line):
            continue
        above = "\n".join(lines[max(0, i - 4):i])
        names = re.findall(r"`([A-Z][A-Za-z]+)`", above)
        fields: set[str] = set()
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            fields |= set(re.findall(r"`([^`]+)`", row.split("|")[1]))
        out.append((names[-1] if names else "?", fields))
    return out


def json_problems(text: str) -> list[str]:
    models, problems = schema_models(), []
    for model, fields in field_tables(text):
        if model not in models:
            problems.append(f"a field table under {model!r}, which is no model of vlmatch.search.service.schema")
            continue
        if fields - models[model]:
            problems.append(f"{model}: the page names {sorted(fields - models[model])}, which it does not have")
        if models[model] - fields:
            problems.append(f"{model}: the page leaves out {sorted(models[model] - fields)}")
    return problems


HTTP_API = DOCS / "http-api.md"


def test_every_json_field_of_the_http_api_tables_is_its_models_and_none_is_left_out():
    text = HTTP_API.read_text(encoding="utf-8")
    tabled = {m for m, _ in field_tables(text)}
    assert {"SearchRequest", "SearchResponse", "SearchResult", "ExplainResponse", "Health"} <= tabled
    assert not json_problems(text)


# --- registry fields -----------------------------------------------------------------------------------------------

@cache
def registry_paths() -> frozenset[tuple[str, ...]]:
    out = set()

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                out.add((*path, k))
                walk(v, (*path, k))

    for entry in json.loads((ROOT / "src" / "vlmatch" / "pretrained" / "registry.json").read_text(encoding="utf-8")):
        walk(entry, ())
    return frozenset(out)


def registry_names(text: str) -> list[str]:
    return [m.group(1) for m in (IDENT.match(s) for s in REGISTRY_NAME.findall(text.replace("\n", " "))) if m]


def registry_problems(text: str) -> list[str]:
    problems = []
    for name in registry_names(text):  # a dotted name is a path from an entry down; a plain one a key at any depth
        key = tuple(name.split("."))
        if not (key in registry_paths() if len(key) > 1 else any(p[-1] == name for p in registry_paths())):
            problems.append(f"`{name}`: no entry of the registry has it")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_registry_field_a_page_names_is_in_the_registry(page):
    assert not registry_problems(page.read_text(encoding="utf-8")), page_name(page)


def test_the_pages_name_registry_fields_to_check():
    names = {n for p in PAGES for n in registry_names(p.read_text(encoding="utf-8"))}
    assert {"open_vocab.relevance.threshold", "duplicates", "mirror"} <= names


# --- the checks catch a stale name ---------------------------------------------------------------------------------

@pytest.mark.parametrize("planted, says", [
    ("Build with `vlmatch index build PHOTOS IDX --no-such-flag`.", "--no-such-flag (not an option of vlmatch index build)"),
    ("Re-score with `index build --score mean --rescore-all`.", "--rescore-all (not an option of vlmatch index build)"),
    ("```bash\nvlmatch search IDX \"a dog\" \\\n    --top-k 5\n```", "--top-k (not an option of vlmatch search)"),
    ("Run `python experiments/open_vocab.py choose --max-columns 128`.", "--max-columns (not an option of experiments/"),
    ("`--open-vocabulary` adds the part.", "--open-vocabulary (not an option of any vlmatch command"),
])
def test_a_planted_stale_flag_is_caught(planted, says):
    page = (DOCS / "search.md").read_text(encoding="utf-8")
    assert not page_flag_problems(page)
    found = page_flag_problems(page + "\n" + planted + "\n")
    assert len(found) == 1 and says in found[0], found


def test_a_planted_stale_or_missing_json_field_is_caught():
    text = HTTP_API.read_text(encoding="utf-8")
    renamed = text.replace("| `relevance_note` |", "| `relevance_why` |", 1)
    assert renamed != text
    assert json_problems(renamed) == ["SearchResponse: the page names ['relevance_why'], which it does not have",
                                      "SearchResponse: the page leaves out ['relevance_note']"]
    dropped = text.replace("| `message` | string or null |", "| message | string or null |", 1)
    assert dropped != text and json_problems(dropped) == ["SearchResponse: the page leaves out ['message']"]


@pytest.mark.parametrize("planted", ["at the registry's `open_vocab.relevance.cutoff`", "its registry record (`dupes`)",
                                     "where a model's record says `mirrored`"])
def test_a_planted_stale_registry_field_is_caught(planted):
    page = (DOCS / "open-vocabulary.md").read_text(encoding="utf-8")
    assert not registry_problems(page)
    assert len(registry_problems(page + "\n" + planted + "\n")) == 1


# --- the install extras ---------------------------------------------------------------------------------------------

def test_the_extras_table_names_the_extras_pyproject_has():
    """docs/getting-started.md's table of extras: each one pyproject.toml declares (``test`` is in the prose above)."""
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    tabled = set(re.findall(r"^\| `([a-z-]+)` \|", text, re.M))
    assert tabled == declared - {"test"}, {"not declared": tabled - declared, "not in the table": declared - tabled}
