"""``vlmatch`` command line: one module per command group, and the only place argparse lives.

Each module of this package adds its commands with ``add_parser(sub)``; ``main`` runs one and turns an
error into one line and an exit status.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import VlmatchError
from . import data, evaluate, explain, features, grounding, models, plot, quickstart, search, serve, train
from .common import DATA_HELP, checkpoint_arg, positive_int

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


def main(argv=None) -> int:
    """Run one command. Bad input ends with one error line and exit 2, an unexpected error with one line
    and exit 1, Ctrl-C with exit 130; ``--debug`` (anywhere on the line) shows the traceback instead."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([x for x in argv if x != "--debug"])
    try:
        args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("vlmatch: interrupted", file=sys.stderr)
        return 130
    except VlmatchError as e:
        if debug:
            raise
        print(f"vlmatch: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # not ours (a library's, the system's): still one line, never a traceback
        if debug:
            raise
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
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that closed the pipe (`| head -1`), a closed stream
            pass
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
