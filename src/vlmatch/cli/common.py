"""What several commands share: argument types and help texts."""

from __future__ import annotations

import argparse
from contextlib import contextmanager, redirect_stdout

DATA_HELP = ("a precomp folder, or 'toyworld' for the bundled synthetic data (generated on first use into "
             "$VLMATCH_CACHE/toyworld, default ~/.cache/vlmatch/toyworld)")


def checked(convert, ok, message: str, out_of_range: str | None = None):
    """An argparse type: ``convert(text)`` where ``ok`` holds of the value; else ``message`` (``out_of_range``
    where it converts but ``ok`` fails), formatted with ``text`` (as repr) and ``value`` (argparse reports it in
    one line)."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(message.format(text=repr(text))) from None
        if not ok(value):
            raise argparse.ArgumentTypeError((out_of_range or message).format(text=repr(text), value=value))
        return value
    return parse


positive_int = checked(int, lambda v: v >= 1, "expected an integer >= 1, got {text}",
                       "expected an integer >= 1, got {value}")


def checkpoint_arg(text: str):
    """An argparse type: a checkpoint folder, or ``pretrained:NAME`` (a model shipped with vlmatch) resolved to
    its hash-checked folder; an unknown name or a damaged file is one argparse error line."""
    from ..checkpoints.read import resolve_checkpoint
    from ..errors import VlmatchError

    try:
        return str(resolve_checkpoint(text))  # a string, as argparse gives every other path
    except VlmatchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def visible_text(text: str, name: str, hint: str = "give the caption whose words to explain") -> str:
    """``text`` refused (a ConfigError naming ``name``) when it is empty or holds nothing visible: only spaces,
    zero-width or other invisible characters (U+200B ...), which read as an empty text would."""
    import unicodedata

    from ..errors import ConfigError

    if not text.strip():
        raise ConfigError(f"{name} is empty: {hint}")
    if all(unicodedata.category(ch)[0] in "CZ" for ch in text):
        kinds = sorted({f"U+{ord(ch):04X}" for ch in text if not ch.isspace()})
        raise ConfigError(f"{name} holds only invisible characters ({', '.join(kinds[:4])}): {hint}")
    return text


def utf8_text(text: str, name: str) -> str:
    """``text`` from the command line, refused (a ConfigError naming the argument ``name``) when it holds
    bytes that are not UTF-8: Python hands them over as lone surrogates, which no tokenizer takes."""
    from ..errors import ConfigError
    from ..io import printable

    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise ConfigError(f"{name} is not UTF-8 text (byte {printable(ch)} at character {i + 1} of "
                              f"\"{printable(text, controls=True)}\"): give the text in UTF-8")
    return text


def options_from(cls, a, **fields):
    """An options dataclass ``cls`` built from the parsed flags of its fields' names (``progress``: not
    ``--no-progress``), ``fields`` given apart where a flag is named otherwise or needs a default."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    flags = {k: getattr(a, k) for k in names if hasattr(a, k)}
    if "progress" in names:
        flags["progress"] = not a.no_progress
    return cls(**{**flags, **fields})


def add_backbone_args(p, backbone: str = "image backbone (default: the one the model was trained on)",
                      weights: str = "local weights file for the backbone") -> None:
    p.add_argument("--backbone", help=backbone)
    p.add_argument("--weights", help=weights)


# --- where an index lives: a folder (default) or a Milvus collection ---------------------------------

def add_backend_args(p, writing: bool = False) -> None:
    """``--backend folder|milvus``, ``--milvus-uri``, ``--collection`` (the token: $VLMATCH_MILVUS_TOKEN)."""
    p.add_argument("--backend", choices=["folder", "milvus"], default="folder",
                   help="where the index lives: an index folder (default) or a Milvus collection")
    p.add_argument("--milvus-uri", metavar="URI",
                   help="with --backend milvus: a milvus-lite .db file or a server URL (http://host:19530); a token, "
                        "if the server needs one, is read from $VLMATCH_MILVUS_TOKEN, never from the command line")
    p.add_argument("--collection", metavar="NAME", help="with --backend milvus: the index's collection name")
    if not writing:
        p.add_argument("--model-dir", metavar="DIR",
                       help="with --backend milvus: the model checkpoint, when not at the path the collection records "
                            "(checked against its digest)")
        p.add_argument("--retriever-dir", metavar="DIR", help="with --backend milvus: the retriever checkpoint, likewise")


def milvus_location(a):
    """The MilvusLocation of ``--backend milvus`` (None for the folder backend); refuses half of one."""
    from ..errors import ConfigError
    from ..search.backends.base import MilvusLocation

    if a.backend != "milvus":
        if a.milvus_uri or a.collection:
            raise ConfigError("--milvus-uri and --collection go with --backend milvus")
        return None
    if not a.milvus_uri or not a.collection:
        raise ConfigError("--backend milvus needs --milvus-uri URI and --collection NAME")
    return MilvusLocation(a.milvus_uri, a.collection)


def open_index(a, folder, **kw):
    """``Index.open`` of the folder ``folder`` or of the Milvus collection the arguments name."""
    from ..errors import ConfigError
    from ..search.index import Index

    loc = milvus_location(a)
    if loc is None:
        if not folder:
            raise ConfigError("name the index folder (or --backend milvus --milvus-uri URI --collection NAME)")
        return Index.open(folder, **kw)
    return Index.open(milvus_uri=loc.uri, collection=loc.collection, model=getattr(a, "model_dir", None),
                      retriever=getattr(a, "retriever_dir", None), **kw)


# --- VLMATCH_PROFILE=1: where a command's time goes --------------------------------------------------

class Phases:
    """Wall time per phase of one command (``with phases("load"): ...``, or :meth:`add`), printed as one line on
    stderr when ``$VLMATCH_PROFILE`` is set (``vlmatch: profile: import 0.91 s, ..., total 1.42 s``; total is since
    the interpreter started). benchmarks/cold_start.py reads it."""

    def __init__(self):
        import os

        self.on = bool(os.environ.get("VLMATCH_PROFILE"))
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        import time

        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + seconds

    def report(self) -> None:
        if not self.on:
            return
        import sys

        since = _since_start()
        parts = [f"{k} {v:.3f} s" for k, v in self.times.items()]
        if since is not None:
            parts.append(f"total {since:.3f} s")
        print("vlmatch: profile: " + ", ".join(parts), file=sys.stderr)


def _since_start() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere)."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# `--json -`: the JSON on standard output, alone (what the command prints otherwise goes to standard error), so
# `vlmatch search ... --json - | jq` reads one document; any other value is a file, written atomically where it is a
# regular one, in place where it is special (/dev/stdout, a FIFO, a device: vlmatch.io.atomic_path)
STDOUT = "-"
_json_stdout = None  # the standard output main() set aside for the JSON while the command runs


def check_json_out(path) -> None:
    """``--json PATH`` checked before any work (:func:`vlmatch.io.check_writable`); ``-`` is standard output."""
    from ..io import check_writable

    if path is not None and str(path) != STDOUT:
        check_writable(path)


def write_json_out(path, obj) -> None:
    """Write ``obj`` as the JSON of ``--json PATH``: to standard output for ``-``, else to the file."""
    import json
    import sys

    from ..io import write_json

    if str(path) == STDOUT:
        stream = _json_stdout or sys.stdout
        stream.write(json.dumps(obj, indent=2) + "\n")
        stream.flush()
    else:
        write_json(path, obj)


@contextmanager
def json_on_stdout(path):
    """While a command runs with ``--json -``: its own prints go to standard error, standard output is the JSON's."""
    import sys

    global _json_stdout
    if path is None or str(path) != STDOUT or isinstance(path, bool):
        yield
        return
    _json_stdout = sys.stdout
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _json_stdout = None
