"""Rows read from an index are not trusted with the file system: a row edited to name a file outside the
indexed photo folder is left out of search results (with a warning), and its file is never read (path_of,
the service's /images/ID and /search refuse it)."""

from __future__ import annotations

import json

import pytest

import vlmatch
from vlmatch.errors import DataError
from vlmatch.search.library.trust import PhotoRoot

from ..tiny import jpegs, tiny_backbone  # noqa: F401  (autouse)

ROOT = "/photos"


@pytest.mark.parametrize("row,refused", [
    ({"id": 0, "path": "/photos/a.jpg", "rel": "a.jpg"}, None),
    ({"id": 0, "path": "/photos/sub/a.jpg", "rel": "sub/a.jpg"}, None),
    ({"id": 2, "path": "/etc/passwd", "rel": "../../../../etc/passwd"}, "leaves the photo folder"),
    ({"id": 2, "path": "/etc/passwd", "rel": "a.jpg"}, "outside the indexed photo folder /photos"),
    ({"id": 2, "path": "/photos/a.jpg", "rel": "/photos/a.jpg"}, "leaves the photo folder"),
    ({"id": 2, "path": "/photos/a.jpg"}, "no path inside the photo folder"),
    ({"id": 2, "rel": "a.jpg"}, "names no file"),
])
def test_a_row_must_name_a_file_of_the_indexed_folder(row, refused):
    got = PhotoRoot({"source": {"kind": "images", "root": ROOT}}, "idx").problem(row)
    assert got is None if refused is None else refused in got


def _milvus_index(tmp_path):
    pytest.importorskip("milvus_lite")
    from vlmatch.search.backends.base import MilvusLocation
    from vlmatch.search.build import build_index

    from ..backends.milvus.test_milvus_safety import _models

    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i:02d}.jpg" for i in range(6)])
    loc = MilvusLocation(str(tmp_path / "m.db"), "rows")
    manifest = build_index(loc, ck["model"], images=photos, retriever_ckpt=ck["retriever"], backbone="tiny32",
                            progress=False, batch_size=2)
    return loc, manifest


def _edit_row(loc, manifest, item_id: int, **fields):
    from vlmatch.search.backends.milvus.client import part_name
    from vlmatch.search.backends.milvus.collection import client_for

    client = client_for(loc.uri)
    name = part_name(loc.collection, manifest["generation"], "images")
    row = client.get(name, ids=[item_id])[0]
    item = row["item"] if isinstance(row["item"], dict) else json.loads(row["item"])
    client.upsert(name, [{**row, "item": {**item, **fields}}])


@pytest.mark.slow  # a Milvus Lite build
def test_a_milvus_row_edited_to_a_file_outside_the_folder_is_refused(tmp_path, capsys):
    loc, manifest = _milvus_index(tmp_path)
    _edit_row(loc, manifest, 2, path="/etc/passwd", rel="../../../../etc/passwd")
    idx = vlmatch.Index.open(milvus_uri=loc.uri, collection=loc.collection)
    hits = idx.search("a red dog", k=len(idx), candidates=len(idx))
    assert 2 not in [h.id for h in hits] and len(hits) == len(idx) - 1
    assert all(h.path.startswith(str((tmp_path / "photos").resolve())) for h in hits)
    assert "image 2 names '../../../../etc/passwd', which leaves the photo folder: left out of the results" in \
        capsys.readouterr().err
    with pytest.raises(DataError, match="image 2: its row names '../../../../etc/passwd', which leaves the photo "
                                        "folder: refused"):
        idx.path_of(2)
    assert idx.path_of(3).endswith("p03.jpg")


@pytest.mark.slow  # a Milvus Lite build
def test_the_service_never_shows_or_reads_an_edited_row(tmp_path):
    from fastapi.testclient import TestClient

    from vlmatch.search.service import IndexBackend, create_app

    loc, manifest = _milvus_index(tmp_path)
    _edit_row(loc, manifest, 2, path="/etc/passwd", rel="../../../../etc/passwd")
    backend = IndexBackend.open(milvus_uri=loc.uri, collection=loc.collection)
    assert backend.path_of(2) is None and backend.path_of(3) is not None
    with TestClient(create_app(backend)) as client:
        r = client.get("/images/2")
        assert r.status_code == 404
        found = client.post("/search", json={"text": "a red dog", "k": 6}).json()["results"]
        assert 2 not in [x["id"] for x in found] and not any(".." in x["path"] for x in found)
        assert client.get("/images/3").status_code == 200


def test_a_folder_index_whose_table_was_edited_and_resealed_is_refused_the_same(tmp_path, capsys):
    from vlmatch.cli import main
    from vlmatch.io import write_json
    from vlmatch.search.backends import folder
    from vlmatch.weights import sha256_file

    from ..tiny import build_args

    pytest.importorskip("faiss")
    from ..backends.milvus.test_milvus_safety import _models

    ck = _models(tmp_path / "ck")
    photos = jpegs(tmp_path / "photos", [f"p{i:02d}.jpg" for i in range(4)])
    out = tmp_path / "idx"
    assert main(build_args(ck["model"], photos, out, retriever=ck["retriever"])) == 0
    items_path = out / "images" / "items.json"
    items = json.loads(items_path.read_text())
    items[1] = {**items[1], "path": "/etc/passwd", "rel": "../../../../etc/passwd"}
    items_path.write_text(json.dumps(items))
    manifest = json.loads((out / "manifest.json").read_text())  # a hostile edit that re-seals the manifest
    manifest["collections"]["images"]["files"]["items.json"] = sha256_file(items_path)
    manifest["seal"] = folder.seal(manifest)
    write_json(out / "manifest.json", manifest)
    idx = vlmatch.Index.open(out)
    assert 1 not in [h.id for h in idx.search("a red dog", k=4, candidates=4)]
    with pytest.raises(DataError, match="image 1: its row names '../../../../etc/passwd'"):
        idx.path_of(1)
