"""The README and the documentation pages run as written (a new user follows only them).

Every page is checked the same way: the README, then each ``docs/**/*.md`` page in path order.

* Every ```python block is executed, in page order, each in a fresh namespace, with the working
  directory set to a folder where a shortened ``vlmatch quickstart`` has run (so
  ``runs/quickstart/quickstart_{vsepp,scan}/best`` exist) and the toy world as data. A snippet must
  define everything it uses and stay quick (a few training steps at most: set small values).
* Every ``vlmatch ...`` line of a ```bash block (also ``torchrun ... -m vlmatch.cli ...``) must parse
  with the real CLI parser: subcommand and every flag. ``[--flag value]`` marks an optional part and
  is checked as if given. Each subcommand used must answer ``--help``.
* Such a command is also run (and must exit 0) when its subcommand is cheap (``CHEAP``) and every
  input it names exists in that folder; so are the next commands the quickstart prints.

A block that shows code without being runnable (a sketch, program output) is fenced ```text, not ```python.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import textwrap
import warnings
from pathlib import Path

import pytest

from vlmatch.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The pages whose code is checked: the README first, then the site's pages.
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
# A quickstart that trains for seconds: same configs and folders as the real one, tiny models.
FAST_QUICKSTART = ["train.epochs=1", "train.max_steps_per_epoch=2", "data.val_max_images=50",
                   "model.embed_dim=16", "model.word_dim=16"]
# Subcommands cheap enough to run on the toy world with the fast quickstart's checkpoints.
CHEAP = {("evaluate",), ("plot",), ("data", "check"), ("configs",), ("models",), ("vocab", "build"), ("pretrained",)}
# Namespace attributes that name inputs (a command runs only when they all exist).
INPUT_ATTRS = ("checkpoint", "sims", "runs", "captions", "data")
QUICKSTART_RUNS = "runs/quickstart"


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def code_blocks(lang: str, page: Path = README) -> list[tuple[int, str]]:
    """(first code line number, dedented code) of every fenced block of ``lang`` in ``page``."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group(2) == lang:
            line = text.count("\n", 0, m.start()) + 2
            out.append((line, textwrap.dedent(m.group(3))))
    return out


def shell_commands(page: Path = README) -> list[tuple[int, list[str]]]:
    """(line in ``page``, argv after `vlmatch`) of every vlmatch command in a bash block."""
    out = []
    for first, code in code_blocks("bash", page):
        lines = code.splitlines()
        i = 0
        while i < len(lines):
            start, text = first + i, lines[i]
            while text.rstrip().endswith("\\") and i + 1 < len(lines):  # continuation lines
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i]
            i += 1
            words = shlex.split(text, comments=True)
            # shell separators: check each command of `a && b ; c | d`
            cmd: list[str] = []
            for w in [*words, "&&"]:
                if w in ("&&", ";", "|", "||"):
                    argv = vlmatch_argv(cmd)
                    if argv is not None:
                        out.append((start, argv))
                    cmd = []
                else:
                    cmd.append(w)
    return out


def vlmatch_argv(words: list[str]) -> list[str] | None:
    if words[:1] == ["vlmatch"]:
        argv = words[1:]
    elif "vlmatch.cli" in words:
        argv = words[words.index("vlmatch.cli") + 1:]
    else:
        return None
    return [w.removeprefix("[").removesuffix("]") for w in argv]  # `[--dtype float16]`: optional part


@functools.cache
def cli_parser():
    """The real CLI parser, built once (parsing leaves it as it was): a build takes ~10 ms and collection parses
    every command of every page."""
    return build_parser()


def subcommand_path(argv: list[str]) -> tuple[str, ...]:
    """The subcommand words at the head of argv (e.g. ('data', 'check'))."""
    parser, path = cli_parser(), []
    for word in argv:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs or word not in subs[0].choices:
            break
        path.append(word)
        parser = subs[0].choices[word]
    return tuple(path)


def parse(argv: list[str], where: str):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return cli_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `vlmatch {shlex.join(argv)}` does not parse: {err.getvalue().strip()}")


def inputs(ns) -> list[str]:
    """The inputs a parsed command names (data 'toyworld' is generated on demand, so it is none)."""
    out = []
    for attr in INPUT_ATTRS:
        value = getattr(ns, attr, None)
        values = value if isinstance(value, list) else [value] if value else []
        out += [str(v) for v in values if not (attr == "data" and v == "toyworld")]
    return out


def runnable(argv: list[str]) -> bool:
    """Cheap, and every input is something the (fast) quickstart writes."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = cli_parser().parse_args(argv)
    except SystemExit:
        return False
    return subcommand_path(argv) in CHEAP and all(p.startswith(QUICKSTART_RUNS) for p in inputs(ns))


def needs_quickstart(text: str) -> bool:
    return QUICKSTART_RUNS in text


def run(argv: list[str], where: str) -> str:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = main(argv)
    except SystemExit as e:  # --help
        rc = e.code
    assert rc == 0, f"{where}: `vlmatch {shlex.join(argv)}` exited {rc}"
    return out.getvalue()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The working folder of the snippets and commands that need no quickstart run."""
    return tmp_path_factory.mktemp("readme_scratch")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A folder where a (fast) quickstart has run; the toy world in the tests' cache."""
    from vlmatch.cli.quickstart import quickstart

    folder = tmp_path_factory.mktemp("readme_home")
    cache = tmp_path_factory.getbasetemp() / "vlcache"  # as conftest sets VLMATCH_CACHE
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLMATCH_CACHE", str(cache))
        mp.chdir(folder)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            quickstart(overrides=FAST_QUICKSTART, progress=False)
    return folder, out.getvalue(), cache


def workdir(request, text: str) -> Path:
    """Where a snippet or command runs: the quickstart's folder if it uses its runs (slow: it trains
    and evaluates two models on the toy world's test split), else a scratch folder."""
    return request.getfixturevalue("home")[0] if needs_quickstart(text) else request.getfixturevalue("scratch")


# A case that uses the quickstart's runs is marked slow (the quickstart fixture and full-split evaluations), and so
# is a block that trains (`train(cfg, ...)`: a second or more even for a few steps).
TRAINS = re.compile(r"(?<![\w.])train\(")
PY_BLOCKS = [pytest.param(page, n, code, id=f"{page_name(page)}:{n}",
                          marks=[pytest.mark.slow] if needs_quickstart(code) or TRAINS.search(code) else [])
             for page in PAGES for n, code in code_blocks("python", page)]
COMMANDS = [(page, n, argv) for page in PAGES for n, argv in shell_commands(page)]
RUNNABLE = [pytest.param(page, n, argv, id=f"{page_name(page)}:{n} {' '.join(argv[:2])}",
                         marks=[pytest.mark.slow] if needs_quickstart(" ".join(argv)) else [])
            for page, n, argv in COMMANDS if runnable(argv)]


def test_the_readme_has_code_to_check():
    readme_py = [p for p in PY_BLOCKS if p.values[0] == README]
    readme_commands = [c for c in COMMANDS if c[0] == README]
    assert len(readme_py) >= 1 and len(readme_commands) >= 6
    assert len(PY_BLOCKS) >= 10 and len(COMMANDS) >= 40
    # every page with code is checked: the docs pages are found, and most of them hold code
    pages_with_code = {p.values[0] for p in PY_BLOCKS} | {c[0] for c in COMMANDS}
    assert len(pages_with_code) >= 10, sorted(map(page_name, pages_with_code))
    # the run rule must not silently skip everything: these documented commands do run
    ran = {subcommand_path(p.values[2]) for p in RUNNABLE}
    assert {("evaluate",), ("plot",), ("data", "check"), ("configs",)} <= ran, ran
    # and most Python blocks run in the fast loop (only those that need the quickstart's runs or train are slow)
    fast = [p for p in PY_BLOCKS if not p.marks]
    assert len(fast) >= 8, [p.id for p in fast]


@pytest.mark.parametrize("page,line,code", PY_BLOCKS)
def test_python_block_runs_as_written(request, monkeypatch, page, line, code):
    monkeypatch.chdir(workdir(request, code))
    # tracebacks point at the page's lines; dont_inherit: the snippet runs without this file's
    # `from __future__ import annotations`, as in a user's script (a dataclass in it needs real annotations)
    compiled = compile("\n" * (line - 1) + code, str(page), "exec", dont_inherit=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*NumPy array is not writable.*")
        exec(compiled, {"__name__": "__readme__"})


@pytest.mark.parametrize("page,line,argv", COMMANDS,
                         ids=[f"{page_name(p)}:{n} {' '.join(a[:2])}" for p, n, a in COMMANDS])
def test_shell_command_parses_and_its_help_works(page, line, argv):
    where = f"{page_name(page)}:{line}"
    parse(argv, where)
    run([*subcommand_path(argv), "--help"], where)


@pytest.mark.parametrize("page,line,argv", RUNNABLE)
def test_cheap_shell_command_runs(request, monkeypatch, page, line, argv):
    where = f"{page_name(page)}:{line}"
    folder = workdir(request, " ".join(argv))
    monkeypatch.chdir(folder)
    missing = [p for p in inputs(parse(argv, "")) if not Path(p).exists()]
    assert not missing, f"{where}: the quickstart did not write {missing}"
    run(argv, where)


@pytest.mark.slow
def test_quickstart_says_where_everything_is_and_its_next_commands_run(home, monkeypatch):
    folder, out, cache = home
    monkeypatch.chdir(folder)
    assert "best-on-validation checkpoint" in out
    for path in ("runs/quickstart/quickstart_vsepp/best", "runs/quickstart/quickstart_scan/best",
                 "runs/quickstart/curves.png"):
        assert path in out and (folder / path).exists(), path
    assert f"toy world      {cache / 'toyworld'}" in out and (cache / "toyworld" / "test_ims.npy").is_file()
    nxt = out.split("Next commands to try:")[1]
    commands = [shlex.split(ln, comments=True)[1:] for ln in nxt.splitlines() if ln.strip().startswith("vlmatch ")]
    assert [c[0] for c in commands][:3] == ["evaluate", "plot", "data"]
    for argv in commands:
        run(argv, "quickstart's next command")
    assert (folder / "curves.png").stat().st_size > 10_000  # the plot command it suggests
