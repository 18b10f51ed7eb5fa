"""One digest for a whole checkpoint folder: :func:`checkpoint_digest` for the copies an index holds (the weights
through config.json's ``weights_sha256``), :func:`checkpoint_fingerprint` for the checkpoint a build was given.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import DataError
from ..io import read_json
from ..weights import sha256_file
from .seal import CHECKSUMS, checkpoint_files, verify_checkpoint


def checkpoint_digest(folder: Path) -> str:
    """SHA-256 of a folder's file names and contents (the weights through config.json's ``weights_sha256``), after
    checking it against its checksums.json."""
    verify_checkpoint(folder)
    cfg = read_json(folder / "config.json")
    if not isinstance(cfg, dict) or not cfg.get("weights_sha256"):
        raise DataError(folder / "config.json", "records no weights_sha256")
    rels = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
    return _files_digest(folder, [rel for rel in rels if rel != "model.safetensors"])


def checkpoint_fingerprint(folder) -> str:
    """The SHA-256 of a folder's checksums.json, or without one of every file's name and content."""
    folder = Path(folder)
    path = folder / CHECKSUMS
    if path.is_file():
        return sha256_file(path)
    return _files_digest(folder, checkpoint_files(folder))


def _files_digest(folder: Path, rels: list[str]) -> str:
    h = hashlib.sha256()
    for rel in rels:
        h.update(f"{rel}\0{sha256_file(folder / rel)}\n".encode())
    return h.hexdigest()
