"""What an index build found (``found`` by kind, ``raw_pairs``), indexed (``build``: seconds, photos/s) and skipped
(``skipped``), as the manifest records it, in a few lines a person reads (:func:`summary_lines`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

KINDS = ("JPEG", "HEIC", "PNG", "TIFF", "RAW", "other")
_KIND = {"JPEG": "JPEG", "HEIF": "HEIC", "PNG": "PNG", "TIFF": "TIFF", "RAW": "RAW"}
SHOWN = 10  # skipped files named one per line on screen; the manifest lists them all


def kind_of(path: Path) -> str:
    """One of :data:`KINDS`, from the file's first bytes (and its suffix, which tells a NEF from a TIFF)."""
    from ..features.photo import file_head, sniff

    head = file_head(path)
    return "other" if head is None else _KIND.get(sniff(head, path), "other")


def found_kinds(root: Path, rels: list[str]) -> dict[str, int]:
    """How many of the files ``rels`` under ``root`` are of each kind (every kind listed, zeros too)."""
    c = Counter(kind_of(root / r) for r in rels)
    return {k: c.get(k, 0) for k in KINDS}


def reason(error: str) -> str:
    """A skipped file's reason without its particulars: the text before the first ``(``, ``;`` or ``:``."""
    cut = min((i for i in (error.find(ch) for ch in "(;:") if i > 0), default=len(error))
    return error[:cut].strip() or error


def summary_lines(manifest: dict, shown: int = SHOWN) -> list[str]:
    """The build's report: found by kind, indexed with the elapsed time and rate, skipped by reason."""
    lines = []
    found, pairs = manifest.get("found"), manifest.get("raw_pairs") or []
    if found:
        kinds = ", ".join(f"{n:,} {k}" for k, n in found.items() if n)
        paired = f"; {len(pairs):,} RAW indexed as the JPEG of the same shot" if pairs else ""
        lines.append(f"found {sum(found.values()):,} files: {kinds}{paired}")
    count = (manifest.get("counts") or {}).get("images")
    b = manifest.get("build") or {}
    if count is not None:
        rate = (f" ({b['photos_per_s']:.1f} photos/s)" if b.get("photos_per_s") else "")
        took = f": {b['encoded']:,} encoded in {b['seconds']:.1f} s{rate}" if "seconds" in b else ""
        lines.append(f"indexed {count:,} photos{took}")
    skipped = manifest.get("skipped") or []
    if skipped:
        by = Counter(reason(s["error"]) for s in skipped)
        lines.append(f"skipped {len(skipped):,}: " + "; ".join(f"{n:,} {r}" for r, n in by.most_common())
                     + " (each in manifest.json \"skipped\")")
        lines += [f"  skipped {s['key']}: {s['error']}" for s in skipped[:shown]]
        if len(skipped) > shown:
            lines.append(f"  ... and {len(skipped) - shown:,} more")
    return lines
