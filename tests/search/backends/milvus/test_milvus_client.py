"""Connecting to Milvus: the token comes from the environment only, names and URIs are checked in
one line before anything is written."""

from __future__ import annotations

import pytest

pymilvus = pytest.importorskip("pymilvus")

from vlmatch.cli import main  # noqa: E402
from vlmatch.errors import ConfigError, DataError  # noqa: E402
from vlmatch.search.backends.milvus import client as milvus_client  # noqa: E402


def test_the_token_comes_from_the_environment(monkeypatch):
    seen = {}

    class Client:
        def __init__(self, **kw):
            seen.update(kw)

    monkeypatch.setattr(pymilvus, "MilvusClient", Client)
    monkeypatch.setenv(milvus_client.TOKEN_ENV, "root:s3cret")
    milvus_client.connect("http://milvus.internal:19530")
    assert seen == {"uri": "http://milvus.internal:19530", "token": "root:s3cret"}
    monkeypatch.delenv(milvus_client.TOKEN_ENV)
    milvus_client.connect("http://milvus.internal:19530")
    assert seen["token"] == ""


def test_no_command_takes_a_token_argument(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--backend", "milvus", "--milvus-uri", "x.db", "--collection", "c", "--token", "t", "q"])
    assert "unrecognized arguments: --token" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["", "1photos", "a-b", "two__parts", "x" * 181])
def test_a_bad_collection_name_is_refused_in_one_line(name):
    with pytest.raises(ConfigError, match="a Milvus collection name is"):
        milvus_client.check_name(name)


def test_a_lite_file_in_a_missing_folder_is_refused(tmp_path, capsys):
    with pytest.raises(DataError, match="folder of the milvus-lite .db file not found"):
        milvus_client.connect(str(tmp_path / "nowhere" / "x.db"))
    assert main(["search", "--backend", "milvus", "--milvus-uri", str(tmp_path / "no" / "x.db"), "--collection", "c",
                 "a dog"]) == 2
    err = capsys.readouterr().err.strip()
    assert "folder of the milvus-lite .db file not found" in err and "\n" not in err


def _hold(db):
    """Another process holding the milvus-lite database ``db`` open (as a running build does); stop it after."""
    import subprocess
    import sys

    code = (f"from pymilvus import MilvusClient; c = MilvusClient(uri={str(db)!r}); c.list_collections(); "
            "print('open', flush=True); import sys; sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "open"
    return proc


@pytest.mark.slow  # Milvus Lite in a process of its own per case
@pytest.mark.parametrize("argv", [
    ["search", "--backend", "milvus", "--milvus-uri", "{db}", "--collection", "c", "a dog"],
    ["index", "update", "--backend", "milvus", "--milvus-uri", "{db}", "--collection", "c"],
    ["index", "build", "--backend", "milvus", "--milvus-uri", "{db}", "--collection", "c", "--model", "{ck}",
     "--images", "{imgs}"],
])
def test_a_lite_database_held_by_another_process_is_said_in_one_line(tmp_path, capsys, toy_ckpts, argv):
    db = tmp_path / "photos.db"
    (tmp_path / "imgs").mkdir()
    proc = _hold(db)
    try:
        argv = [a.format(db=db, ck=toy_ckpts["vsepp"], imgs=tmp_path / "imgs") for a in argv]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err
        assert f"{db}: another process holds this milvus-lite database (process {proc.pid} (" in err
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_a_lite_uri_naming_a_file_is_refused_in_one_line(tmp_path, capsys):
    from PIL import Image

    photo = tmp_path / "photo.db"
    Image.new("RGB", (4, 4)).save(photo, "JPEG")
    before = photo.read_bytes()
    for argv in (["search", "--backend", "milvus", "--milvus-uri", str(photo), "--collection", "c", "a dog"],
                 ["index", "update", "--backend", "milvus", "--milvus-uri", str(photo), "--collection", "c"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"{photo}: is a file, not a milvus-lite database" in err and "\n" not in err
    assert photo.read_bytes() == before


def test_searching_a_missing_lite_database_creates_nothing(tmp_path, capsys):
    db = tmp_path / "none.db"
    assert main(["search", "--backend", "milvus", "--milvus-uri", str(db), "--collection", "c", "a dog"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{db}: no milvus-lite database there (a search or an open creates nothing)" in err and "\n" not in err
    assert not db.exists() and list(tmp_path.iterdir()) == []


def test_updating_a_missing_lite_database_creates_nothing(tmp_path, capsys):
    db = tmp_path / "none.db"
    assert main(["index", "update", "--backend", "milvus", "--milvus-uri", str(db), "--collection", "c"]) == 2
    assert "no milvus-lite database there" in capsys.readouterr().err and not db.exists()
