"""``GET /explain/{id}`` and ``/explain/{id}.png`` of a photo deleted, overwritten with text or replaced by a
symlink after it was indexed answer as ``/images`` does (404 file_missing, 409 photo_changed), never 500."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import vlmatch
from vlmatch.search.service import IndexBackend, create_app

from ..photo_index import build_photo_index


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain_files")
    idx = vlmatch.Index.open(build_photo_index(root, n=5))
    with TestClient(create_app(IndexBackend(idx)), raise_server_exceptions=False) as c:
        yield c, idx, root


def _change(idx, root, id, how):  # noqa: A002
    path = Path(idx.path_of(id))
    if how == "deleted":
        os.unlink(path)
    elif how == "text":
        path.write_text("not a photo\n")
    elif how == "symlink_to_text":
        (root / "notes.txt").write_text("not a photo\n")
        os.unlink(path)
        os.symlink(root / "notes.txt", path)
    elif how == "dangling_symlink":
        os.unlink(path)
        os.symlink(root / "nowhere.jpg", path)


@pytest.mark.parametrize("how, id", [("deleted", 0), ("text", 1), ("symlink_to_text", 2), ("dangling_symlink", 3)])
def test_explain_of_a_changed_file_answers_as_images_does(served, how, id):  # noqa: A002
    client, idx, root = served
    _change(idx, root, id, how)
    images = client.get(f"/images/{id}")
    assert images.status_code == (404 if how in ("deleted", "dangling_symlink") else 409)
    for route in (f"/explain/{id}", f"/explain/{id}.png"):
        r = client.get(route, params={"text": "a dog"})
        assert (r.status_code, r.json()["error"]) == (images.status_code, images.json()["error"]), route


def test_explain_of_a_symlink_to_an_image_answers_as_images_does(served):
    client, idx, root = served
    path = Path(idx.path_of(4))
    shutil.copy(path, root / "elsewhere.jpg")
    os.unlink(path)
    os.symlink(root / "elsewhere.jpg", path)
    images = client.get("/images/4")
    r = client.get("/explain/4", params={"text": "a dog"})
    assert r.status_code == images.status_code
    if images.status_code != 200:
        assert r.json()["error"] == images.json()["error"]
