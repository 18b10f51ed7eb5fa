"""What a script of the rooms reads that another command makes, checked before its first expensive step: a missing
input ends the script at once with one line saying what to run first."""

from __future__ import annotations

import sys
from pathlib import Path

from .caches import EXTRACT, features_dir
from .paths import DATA_VAR, data_root


def _script() -> str:
    """The running script as its room names it (benchmarks/search.py, experiments/flickr8k_rerank.py, ...)."""
    if not (sys.argv and sys.argv[0].endswith(".py")):
        return "benchmarks"
    script = Path(sys.argv[0]).resolve()
    return f"{script.parent.name}/{script.name}"


def stop(path: Path, what: str, first: str) -> None:
    """End the script: ``path`` (``what``) is missing, and the command ``first`` makes it."""
    sys.exit(f"{_script()}: {path} is missing ({what}): run `{first}` first")


def need_shared(shared: Path | None = None) -> None:
    """The Flickr8k images and Karpathy JSON (``shared``, default ``$VLMATCH_DATA/flickr8k``; no command makes them)."""
    from vlmatch.data.resolve import FLICKR8K_SOURCE

    shared = Path(shared) if shared is not None else data_root(check=False) / "flickr8k"
    for p, what in ((shared / "dataset_flickr8k.json", "Flickr8k's Karpathy captions"),
                    (shared / "images", "the Flickr8k images")):
        if not p.exists():
            sys.exit(f"{_script()}: {p} is missing ({what}; the data lives in ${DATA_VAR}, now "
                     f"{data_root(check=False)}): {FLICKR8K_SOURCE}")


def need_features(folder: Path | None = None, splits=("dev",), captions: bool = True) -> None:
    """The precomp feature cache ``experiments/flickr8k.py`` extracts (default: the study's, Lite0 224 px):
    ``{split}_ims.npy`` (and captions)."""
    folder = Path(folder) if folder is not None else features_dir()
    names = [f"{s}_ims.npy" for s in splits] + ([f"{s}_caps.txt" for s in splits] if captions else [])
    for name in names:
        if not (folder / name).is_file():
            # the study's cache (wherever a test or --features puts it) is made by flickr8k.py; another, by hand
            first = EXTRACT if folder.name == features_dir().name else f"vlmatch features extract ... --out {folder}"
            stop(folder / name, "the Flickr8k features and captions this script reads", first)


def need_run(best: Path, make: str = "python experiments/flickr8k.py --config CONFIG --name RUN") -> None:
    """A trained checkpoint folder (``$VLMATCH_CACHE/runs/<run>/best``)."""
    if not (Path(best) / "config.json").is_file():
        stop(Path(best), "a trained checkpoint", make)
