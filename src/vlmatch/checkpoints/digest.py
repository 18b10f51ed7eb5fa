"""One digest that stands for a whole checkpoint folder, as a search index records the checkpoints it uses.

Two digests, for two uses:

- :func:`checkpoint_digest`: what an index's manifest records of each checkpoint copy inside it (``model/``,
  ``retriever/``; the folder index and the Milvus collection set alike). The weights enter through the
  ``weights_sha256`` of ``config.json`` (``load_model`` checks it against ``model.safetensors``), so the large
  file is not hashed again at every open.
- :func:`checkpoint_fingerprint`: what a build records of the checkpoint it was given (``--model``,
  ``--retriever``), so an update or a resumed build knows whether it is the same one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import DataError
from ..io import read_json
from ..weights import sha256_file
from .seal import CHECKSUMS, checkpoint_files, verify_checkpoint


def checkpoint_digest(folder: Path) -> str:
    """SHA-256 of a checkpoint folder's file names and contents; the weights enter through the
    ``weights_sha256`` of ``config.json``, which ``load_model`` checks against ``model.safetensors``. A copy
    saved with its checksums.json (every copy since they are sealed) is checked whole against it first, so a
    changed part is named."""
    verify_checkpoint(folder)
    cfg = read_json(folder / "config.json")
    if not isinstance(cfg, dict) or not cfg.get("weights_sha256"):
        raise DataError(folder / "config.json", "records no weights_sha256")
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel != "model.safetensors":
            h.update(f"{rel}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def checkpoint_fingerprint(folder) -> str:
    """One digest of a whole checkpoint folder: the SHA-256 of its checksums.json, or, for a folder without
    one, of every file's name and content (so resumable work keyed by it never mixes two checkpoints)."""
    folder = Path(folder)
    path = folder / CHECKSUMS
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for rel in checkpoint_files(folder):
        h.update(f"{rel}\0{sha256_file(folder / rel)}\n".encode())
    return h.hexdigest()
