"""What an ``index update`` of a photo-folder index would do: the files new, changed and removed since the
index was built, and the rows kept. The update uses it, and so does a second ``index build`` over an index
of the same folder and model, which says it instead of encoding every photo again."""

from __future__ import annotations

from pathlib import Path

from ..features.photo import READER_VERSION, file_orientation
from ..weights import sha256_file
from .scan import file_stat, scan_folder


def plan_changes(root: Path, rels: list[str], old_items: list[dict], stale_reader: bool, add_concepts: bool = False):
    """(rows kept, their items, the files to encode, report) for the photo folder's current files ``rels``
    against the index's rows ``old_items``. A file is kept when its size and mtime are the row's, or its
    bytes' SHA-256 is; ``stale_reader``: the index was encoded by an older photo reader, so a photo with an
    EXIF orientation is encoded again (counted as ``reoriented``); ``add_concepts``: the index has no concept
    vectors yet, so every unchanged photo is encoded again too (counted as ``concepts_added``)."""
    by_rel = {it["rel"]: (row, it) for row, it in enumerate(old_items)}
    keep_rows, keep_items, todo, reoriented, concept_only = [], [], [], 0, 0
    for rel in rels:
        st = file_stat(root, rel)
        if rel in by_rel:
            row, it = by_rel[rel]
            same = (it["size"], it["mtime_ns"]) == (st["size"], st["mtime_ns"])
            if not same and it.get("sha256") and it["size"] == st["size"]:
                same = sha256_file(root / rel) == it["sha256"]
            if same and stale_reader and file_orientation(root / rel) != 1:
                same, reoriented = False, reoriented + 1
            if same and add_concepts:
                same, concept_only = False, concept_only + 1
            if same:
                keep_rows.append(row)
                keep_items.append(it)
                continue
        todo.append(rel)
    deleted = len(old_items) - len(keep_rows) - sum(r in by_rel for r in todo)
    report = {"kept": len(keep_rows), "new": sum(r not in by_rel for r in todo),
              "changed": sum(r in by_rel for r in todo) - reoriented - concept_only, "deleted": deleted}
    if stale_reader:  # encoded by an older photo reader: how many were turned upright
        report["reoriented"] = reoriented
    if add_concepts:  # the unchanged photos encoded again for their concept vectors
        report["concepts_added"] = concept_only
    return keep_rows, keep_items, todo, report


def same_index_plan(out, images, model_ckpt, retriever_ckpt) -> dict | None:
    """When ``out`` already holds a folder index of the photo folder ``images`` built with the same model
    (and retriever), what ``index update`` would do there (:func:`plan_changes`' report, plus ``photos``: the
    files a rebuild would encode); None otherwise (no index, another folder or model, an interrupted build
    to resume, or an index that cannot be read: the build says what is wrong with it)."""
    from ..checkpoints.digest import checkpoint_fingerprint
    from .backends.folder import open_parts
    from .checks import read_items

    out = Path(out)
    if not (out / "manifest.json").is_file() or (out / "build").exists():  # work left to resume or recover
        return None
    try:
        manifest, parts = open_parts(out)
        src = manifest.get("source") or {}
        root = Path(images).resolve()
        if src.get("kind") != "images" or Path(src.get("root", "")) != root or "open_vocab" not in manifest:
            return None  # another folder, or an index an update would encode whole again (its concept vectors)
        if manifest["model"].get("checkpoint_sha256") != checkpoint_fingerprint(Path(model_ckpt)):
            return None
        old_retriever = (manifest.get("retriever") or {}).get("checkpoint_sha256")
        new_retriever = None if retriever_ckpt is None else checkpoint_fingerprint(Path(retriever_ckpt))
        if old_retriever != new_retriever:
            return None
        rels = scan_folder(root)
        old = read_items(parts["images"] / "items.json", "path")
    except Exception:  # noqa: BLE001 - not an index this build could update: the build proceeds and judges it
        return None
    *_, report = plan_changes(root, rels, old, manifest.get("reader", 1) < READER_VERSION)
    return {**report, "photos": len(rels)}


def update_line(out, plan: dict) -> str:
    """The one line a second ``index build`` says (see :func:`same_index_plan`)."""
    parts = [f"{plan['new']:,} new", f"{plan['changed']:,} changed"]
    if plan.get("reoriented"):
        parts.append(f"{plan['reoriented']:,} turned upright")
    did = (f"would encode {', '.join(parts)} photos and drop {plan['deleted']:,} removed ({plan['kept']:,} kept as "
           f"they are)")
    return (f"{out} already indexes this photo folder with this model: `vlmatch index update {out}` {did}; "
            f"pass --rebuild to encode all {plan['photos']:,} photos again")
