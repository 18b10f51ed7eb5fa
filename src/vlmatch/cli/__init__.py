"""``vlmatch`` command line: one module per command group, and the only place argparse lives.

Each module of this package adds its commands with ``add_parser(sub)``; ``main`` runs one and turns an
error into one line and an exit status.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import VlmatchError
from . import data, evaluate, explain, features, grounding, models, plot, quickstart, search, serve, train
from .common import DATA_HELP, checkpoint_arg, json_on_stdout, positive_int

__all__ = ["DATA_HELP", "build_parser", "checkpoint_arg", "main", "positive_int"]


# The command groups, in the order ``vlmatch --help`` lists their commands.
GROUPS = (quickstart, train, evaluate, grounding, data, models, plot, serve, features, search, explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlmatch", description="Image-text matching and cross-modal retrieval.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error (accepted "
                                                             "anywhere on the command line)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parser(sub)
    return parser


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string (of any command) that takes one value (flags, --help and the like take nargs=0)."""
    out = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _value_options(sub)
        elif action.option_strings and action.nargs in (None, "?"):
            out |= set(action.option_strings)
    return out


def _negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--near -33.87,151.21,10`` as ``--near=-33.87,151.21,10``: argparse reads a value that starts with a
    minus and is not one plain number as an option (every southern latitude, every western longitude)."""
    import re

    takes = _value_options(parser)
    out = []
    for x in argv:
        if out and out[-1] in takes and re.match(r"-[0-9.]", x):
            out[-1] = f"{out[-1]}={x}"
        else:
            out.append(x)
    return out


def main(argv=None) -> int:
    """Run one command. Bad input ends with one error line and exit 2, an unexpected error with one line
    and exit 1, Ctrl-C with exit 130; ``--debug`` (anywhere on the line) shows the traceback instead."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    parser = build_parser()
    args = parser.parse_args(_negative_values(parser, [x for x in argv if x != "--debug"]))
    try:
        with json_on_stdout(getattr(args, "json", None)):  # `--json -`: standard output is the JSON's alone
            args.func(args)
    except (KeyboardInterrupt, Exception) as e:
        if debug:
            raise
        if isinstance(e, KeyboardInterrupt):
            print("vlmatch: interrupted", file=sys.stderr)
            return 130
        if isinstance(e, VlmatchError):
            print(f"vlmatch: error: {e}", file=sys.stderr)
            return 2
        # not ours (a library's, the system's): still one line, never a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"vlmatch: error: {type(e).__name__}: {first} (unexpected; run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    if from_command_line and getattr(args, "quick_exit", False) and getattr(args, "backend", "folder") == "folder":
        quick_exit(0)
    return 0


def quick_exit(code: int) -> None:
    """End a finished read-only command (search, explain) without the interpreter's teardown: its exit
    functions run (caches flush, locks are released), the clearing of a thousand modules torch brought in
    (half a second of a search's cold start) does not. Only from the command line: ``main(argv)`` returns."""
    import atexit
    import errno
    import os
    from contextlib import suppress

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that closed the pipe (`| head -1`), a closed stream
            pass
        except OSError as e:  # a write that failed (a full disk): the output is not whole, the exit says so
            if e.errno == errno.EPIPE:
                continue
            name = "standard output" if stream is sys.stdout else "standard error"
            with suppress(OSError):
                os.write(2, f"vlmatch: error: writing {name} failed: {e.strerror or e}\n".encode())
            code = code or 1
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
