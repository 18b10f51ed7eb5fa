"""What an ``index update`` of a photo-folder index would do: the files new, changed and removed since the
index was built, and the rows kept. The update uses it, and so does a second ``index build`` over an index
of the same folder and model, which says it instead of encoding every photo again."""

from __future__ import annotations

from pathlib import Path

from ..features.photo import READER_VERSION
from .inputs import plan_changes
from .scan import scan_folder


def same_index_plan(out, images, model_ckpt, retriever_ckpt) -> dict | None:
    """When ``out`` already holds a folder index of the photo folder ``images`` with the same model (and retriever),
    what ``index update`` would do there (:func:`plan_changes`' report, plus ``photos``: the files a rebuild would
    encode); None otherwise, or where the index cannot be read (the build then says what is wrong)."""
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
