"""Toy-world checkpoints trained for a few steps, shared by the search tests."""

import pytest

from vlmatch.training.config import load_config
from vlmatch.training.loop import train

from ..conftest import made_once


def _train(world, out, model_yaml: dict, steps: int = 6):
    cfg = load_config(None, [f"model.{k}={v}" for k, v in model_yaml.items()] +
                      [f"data.path={world}", "train.epochs=1", f"train.max_steps_per_epoch={steps}",
                       "train.batch_size=64", "train.threads=1", "train.warmup_epochs=1", "data.min_word_count=1"])
    train(cfg, out, progress=False)
    return out / "best"


@pytest.fixture(scope="session")
def toy_ckpts(small_world, tmp_path_factory):
    """{"scan": best/ of a SCAN t-i (D=32), "vsepp": best/ of a VSE++ (D=32)} on the small world."""
    def make(root):
        _train(small_world, root / "scan", {"name": "scan_t2i_avg", "embed_dim": 32, "word_dim": 16})
        _train(small_world, root / "vsepp", {"name": "vsepp", "embed_dim": 32, "word_dim": 16}, 20)

    root = made_once(tmp_path_factory, "ckpts", make)  # trained once per run, whichever worker asks first
    return {"scan": root / "scan" / "best", "vsepp": root / "vsepp" / "best"}


@pytest.fixture(scope="session")
def milvus_server():
    """One embedded Milvus standalone server (2.3.5) for the whole session, in a temporary folder on free
    ports, stopped at the end (only the process it started). Skipped, with the reason, where the
    ``milvus`` package cannot run (not installed, not Linux)."""
    from vlmatch_lab.milvus_server import MilvusTestServer, why_not

    why = why_not()
    if why:
        pytest.skip(why)
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="vlmatch-milvus-")  # not pytest's folders: other sessions rotate those away
    server = MilvusTestServer(base).start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


def empty_server(server) -> str:
    from pymilvus import MilvusClient

    if server.pid is None:  # a test killed it and failed before restarting it
        server.start()
    c = MilvusClient(uri=server.uri)
    for name in c.list_collections():
        c.drop_collection(name)
    c.close()
    return server.uri
