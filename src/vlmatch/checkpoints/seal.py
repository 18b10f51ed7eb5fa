"""``checksums.json``: the SHA-256 of every file of a checkpoint folder, written last on save and checked first on
load, so a file missing, added or changed since (another model's calibration, an edited file) is refused by name.
Hidden files (locks, temporaries) are not listed. A folder saved sealed (config.json ``format`` 2) found without
one is refused; only an older save (no format, nothing format 2 writes) loads without it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import DataError
from ..io import read_json, write_text
from ..weights import sha256_file

CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = 1
# config.json's "format": 2 since checkpoints are saved sealed; none (format 1): an older save
CHECKPOINT_FORMAT = 2
SEALED_SINCE = 2


def checkpoint_format(config: dict) -> int:
    """The format a checkpoint's config.json records (1 when it records none: saved before sealing)."""
    fmt = config.get("format", 1) if isinstance(config, dict) else 1
    return fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else 0


def sealed_format(config: dict) -> bool:
    """Whether a checkpoint was saved sealed (a missing checksums.json is then a part removed since)."""
    return checkpoint_format(config) >= SEALED_SINCE


def checkpoint_files(folder: Path) -> list[str]:
    """The files a folder's seal lists (relative, sorted): all but checksums.json and hidden ones."""
    out = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if p.is_file() and rel.as_posix() != CHECKSUMS and not any(part.startswith(".") for part in rel.parts):
            out.append(rel.as_posix())
    return sorted(out)


def missing_seal(folder, config: dict) -> DataError:
    """The error for ``folder``, saved sealed but found without its checksums.json."""
    return DataError(folder, f"has no {CHECKSUMS}, but its config.json says format {checkpoint_format(config)} (saved "
                             "sealed): a part was removed or replaced since; restore the checkpoint whole, or save "
                             "the model again")


# vlmatch.models.calibration.RECORD (a layer above): only a sealed-format save records weights_sha256 in it
CALIBRATION_RECORD = "calibration.json"


def sealed_marks(folder) -> list[str]:
    """What in ``folder`` only a sealed-format save writes, config.json's format aside."""
    path = Path(folder) / CALIBRATION_RECORD
    if path.is_file():
        rec = read_json(path)
        if isinstance(rec, dict) and "weights_sha256" in rec:
            return [f"{CALIBRATION_RECORD} records weights_sha256"]
    return []


def unsealed_problem(folder, config: dict) -> DataError | None:
    """Why ``folder``, found without checksums.json, is not an older save (None when it is: no ``format`` in
    ``config`` and nothing a sealed-format save writes); a removed format would load the other files unchecked."""
    folder = Path(folder)
    if sealed_format(config):
        return missing_seal(folder, config)
    if isinstance(config, dict) and "format" in config:
        return DataError(folder / "config.json", f"records format {config['format']!r}, which no vlmatch writes (an "
                                                 f"older save records none, a sealed one {CHECKPOINT_FORMAT}): the file "
                                                 "was edited; restore the checkpoint whole")
    marks = sealed_marks(folder)
    if marks:
        return DataError(folder / "config.json", f"records no format (as an older vlmatch saved them), but {marks[0]}, "
                                                 f"which only format {CHECKPOINT_FORMAT} writes, and the folder has no "
                                                 f"{CHECKSUMS}: its format was removed since (its other files would "
                                                 "load unchecked); restore the checkpoint whole")
    return None


def seal_checkpoint(folder) -> str:
    """Write ``folder/checksums.json``; returns its SHA-256, one digest for the whole checkpoint."""
    folder = Path(folder)
    record = {"format": CHECKSUMS_FORMAT, "files": {rel: sha256_file(folder / rel) for rel in checkpoint_files(folder)}}
    text = json.dumps(record, indent=2) + "\n"
    write_text(folder / CHECKSUMS, text)
    return hashlib.sha256(text.encode()).hexdigest()


def read_checksums(folder) -> dict[str, str] | None:
    """The file -> SHA-256 table of ``folder/checksums.json``; None when the folder has none."""
    path = Path(folder) / CHECKSUMS
    if not path.exists():
        return None
    rec = read_json(path)
    files = rec.get("files") if isinstance(rec, dict) else None
    if (not isinstance(files, dict) or rec.get("format") != CHECKSUMS_FORMAT
            or not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items())):
        raise DataError(path, f"not a checkpoint's checksums (expected {{\"format\": {CHECKSUMS_FORMAT}, \"files\": "
                              "{NAME: SHA-256}}): the file was edited; restore it or save the checkpoint again")
    return files


def verify_checkpoint(folder, known: dict[str, str] | None = None) -> dict[str, str] | None:
    """Every file of ``folder`` against its ``checksums.json`` (missing, unlisted or changed: a DataError naming it);
    the table, or None without one. ``known``: file -> SHA-256 the caller has just computed."""
    folder = Path(folder)
    files = read_checksums(folder)
    if files is None:
        return None
    present = set(checkpoint_files(folder))
    for rel in sorted(files):
        if rel not in present:
            raise DataError(folder / rel, f"missing, but listed in {folder / CHECKSUMS}: the checkpoint is "
                                          "incomplete (a part was deleted or moved); restore it")
    for rel in sorted(present - set(files)):
        raise DataError(folder / rel, f"not part of this checkpoint (not listed in {folder / CHECKSUMS}): it was "
                                      "added or copied in from elsewhere; remove it, or save the checkpoint again")
    for rel in sorted(files):
        actual = (known or {}).get(rel) or sha256_file(folder / rel)
        if actual != files[rel]:
            raise DataError(folder / rel, f"content does not match the SHA-256 recorded in {folder / CHECKSUMS} "
                                          f"({actual[:12]}... != {files[rel][:12]}...): the file was edited or "
                                          "replaced by another checkpoint's; restore it")
    return files
