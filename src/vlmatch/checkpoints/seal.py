"""A checkpoint folder sealed whole: ``checksums.json`` lists the SHA-256 of every file in it.

The files are the weights, ``config.json``, the calibration, the vocabulary, the tokenizer, the
text-encoder and backbone records, and in a training checkpoint the optimiser and trainer state. The
record is written last when a checkpoint is saved and checked first when it is loaded: a file that is
missing, added or changed since is refused by name, so parts of two checkpoints (another model's
calibration, an edited beta, deleted calibration files) never load as one. Hidden files (``.name``: lock
files, an interrupted write's temporaries) are never read by a load and are not listed.

A folder whose ``config.json`` says it was saved sealed (``format`` 2) but that has no ``checksums.json`` lost a
part since: it is refused in one line naming the folder (:func:`missing_seal`), by a load, a resume and
``init_from`` alike (:mod:`vlmatch.checkpoints.read`). Only a folder saved before vlmatch sealed them (no format
recorded, and none of what format 2 writes: :func:`unsealed_problem`) is read without one (``load_model`` says so in
a note; ``vlmatch seal`` records it); its weights are still checked against config.json. A folder saved sealed is never
sealed again by hand: a part changed since cannot be told from a change of the user's own.
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
# config.json's "format": 2 since checkpoints are saved sealed (and their calibration bound to their
# weights); a config.json without it is of format 1, saved before: the one kind loaded without a seal
CHECKPOINT_FORMAT = 2
SEALED_SINCE = 2


def checkpoint_format(config: dict) -> int:
    """The format a checkpoint's config.json records (1 when it records none: saved before sealing)."""
    fmt = config.get("format", 1) if isinstance(config, dict) else 1
    return fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else 0


def sealed_format(config: dict) -> bool:
    """Whether a checkpoint was saved sealed (so a missing checksums.json, or a calibration that names no
    weights, is a part removed since, not an older save)."""
    return checkpoint_format(config) >= SEALED_SINCE


def checkpoint_files(folder: Path) -> list[str]:
    """The files of a checkpoint folder that its seal lists (relative, sorted): every file but checksums.json
    and hidden ones."""
    out = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if p.is_file() and rel.as_posix() != CHECKSUMS and not any(part.startswith(".") for part in rel.parts):
            out.append(rel.as_posix())
    return sorted(out)


def missing_seal(folder, config: dict) -> DataError:
    """The error for ``folder``, saved sealed (its config.json, ``config``, says so) but found without its
    checksums.json: one line naming the folder. (Not sealed again: nothing would tell a change of the user's own
    from a part edited or swapped in since.)"""
    return DataError(folder, f"has no {CHECKSUMS}, but its config.json says format {checkpoint_format(config)} (saved "
                             "sealed): a part was removed or replaced since; restore the checkpoint whole, or save "
                             "the model again")


# what only a sealed-format save writes besides config.json's format: calibration.json's weights_sha256 (the
# calibration's record; its name is vlmatch.models.calibration.RECORD, a layer above this one)
CALIBRATION_RECORD = "calibration.json"


def sealed_marks(folder) -> list[str]:
    """What in ``folder`` only a sealed-format save (format 2) writes, config.json's format aside: a calibration.json
    that records ``weights_sha256``."""
    path = Path(folder) / CALIBRATION_RECORD
    if path.is_file():
        rec = read_json(path)
        if isinstance(rec, dict) and "weights_sha256" in rec:
            return [f"{CALIBRATION_RECORD} records weights_sha256"]
    return []


def unsealed_problem(folder, config: dict) -> DataError | None:
    """Why ``folder``, found without checksums.json, is not a checkpoint saved by an older vlmatch (None when it
    is one: no ``format`` in its config.json, ``config``, and nothing a sealed-format save writes). A folder saved
    sealed lost its seal (:func:`missing_seal`); a config.json that records no format beside a part only format 2
    writes had its format removed (a downgrade, which would load the folder's other files unchecked)."""
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
    """Write ``folder/checksums.json`` (every file's SHA-256) and return the SHA-256 of that record: one
    digest that stands for the whole checkpoint (an index build fingerprints its model with it)."""
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
    """Check every file of ``folder`` against its ``checksums.json``: a listed file missing, a file not
    listed, or one whose content changed is a DataError naming that file. Returns the table (None when the
    folder has no checksums.json: a checkpoint saved before vlmatch sealed them; the caller says so).
    ``known``: file -> SHA-256 the caller has just computed (not read twice)."""
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
