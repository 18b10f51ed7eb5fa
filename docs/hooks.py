"""mkdocs hooks of the vlmatch site (not part of the package).

The results pages include ``benchmarks/results/*.md`` and ``experiments/results/*.md`` as they are
(``pymdownx.snippets``), so their relative links, e.g. ``scan_attention/s17_base_dog.png``, must resolve
from ``docs/results/``: the files those links name are added to the site under ``results/`` from both
rooms' ``results/``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "benchmarks" / "results", ROOT / "experiments" / "results")  # speed and scale; quality
ASSETS = {".png", ".jpg", ".jpeg", ".svg", ".json"}


def on_files(files, config):
    for room in RESULTS:
        for path in sorted(room.rglob("*")):
            if path.is_file() and path.suffix.lower() in ASSETS:
                uri = "results/" + path.relative_to(room).as_posix()
                if files.get_file_from_path(uri) is None:
                    files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
