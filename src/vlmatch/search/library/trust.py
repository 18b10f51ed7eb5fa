"""Rows read from an index are not trusted with the file system: a photo's ``path`` must be its ``rel`` (a plain
relative path) in the photo folder the manifest records (``source.root``, or ``source.images_dir`` of features). A
row naming anything else is left out of the results with a warning, and asking for its file is refused.

This keeps an edited row from naming a file outside that folder; it is no defence against a writer of the index
itself, who can rewrite the manifest and its seal (docs/milvus.md, "Access").
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path, PurePosixPath

from ...errors import DataError

log = logging.getLogger("vlmatch.search")


class PhotoRoot:
    """The photo folder of an index (from its manifest's ``source``), which every row's file must lie in."""

    def __init__(self, manifest: dict, where) -> None:
        src = manifest.get("source") or {}
        base = src.get("root") if src.get("kind") == "images" else src.get("images_dir")
        self.base = Path(base) if isinstance(base, str) and base else None
        self.where = where  # the index, as messages name it
        self._warned: set[int] = set()

    def problem(self, row: dict) -> str | None:
        """Why ``row``'s file is not one of the indexed folder's (None: it is)."""
        path, rel = row.get("path"), row.get("rel")
        if not isinstance(path, str) or not path or "\0" in path:
            return "names no file"
        if not isinstance(rel, str) or not rel or "\0" in rel:
            return f"names {path!r} with no path inside the photo folder"
        parts = PurePosixPath(rel.replace(os.sep, "/")).parts
        if rel.startswith(("/", os.sep)) or ".." in parts or Path(rel).is_absolute():
            return f"names {rel!r}, which leaves the photo folder"
        if self.base is None:  # features without an image folder: the rows are names, not files
            return None if path == rel else f"names {path!r}, not its item {rel!r}"
        inside = self.base / rel
        if path in (str(inside), os.path.normpath(inside)):
            return None
        try:
            if path == str(inside.resolve()):  # the build records the resolved path
                return None
        except (OSError, RuntimeError):
            pass
        return f"names {path!r}, outside the indexed photo folder {self.base}"

    def path(self, row: dict) -> str:
        """``row``'s file, or a DataError saying why it is refused."""
        why = self.problem(row)
        if why is not None:
            raise DataError(f"{self.where}: image {row.get('id')}", f"its row {why}: refused (the index was edited?)")
        return row["path"]

    def current(self, row: dict) -> str:
        """``row``'s file (:meth:`path`), checked to be the one indexed (:func:`.unchanged.check_unchanged`):
        what explains, thumbnails or serves a photo reads it through this."""
        from .unchanged import check_unchanged

        path = self.path(row)
        if self.base is not None:  # an index of features names items, not files
            check_unchanged(row, path)
        return path

    def keep(self, row: dict) -> bool:
        """Whether a search result may show ``row``; a refused one is warned about once."""
        why = self.problem(row)
        if why is None:
            return True
        rid = row.get("id")
        if rid not in self._warned:
            self._warned.add(rid)
            msg = f"vlmatch: warning: {self.where}: image {rid} {why}: left out of the results (the index was edited?)"
            print(msg, file=sys.stderr)
            log.warning(msg)
        return False
