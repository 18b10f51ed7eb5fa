"""Connecting to Milvus: the token comes from the environment only, names and URIs are checked in
one line before anything is written."""

from __future__ import annotations

import pytest

pymilvus = pytest.importorskip("pymilvus")

from vlmatch.cli import main  # noqa: E402
from vlmatch.errors import ConfigError, DataError  # noqa: E402
from vlmatch.search import milvus_client  # noqa: E402


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
