"""Every Milvus server these tests start listens on a proxy port of its own.

The ``milvus`` package picks the proxy port by trying 19530, 19531, ... and releases it before the server
listens (10-15 s later), so two workers starting servers at once both took 19530 and their clients reached
either server: the other worker's ``empty_server`` dropped this one's collections ("collection not found"). Until
the helper (tests/search/milvus_server.py) takes a free port itself, its first start does so here."""

import pytest

from ...milvus_server import MilvusTestServer
from ...serving import free_port


@pytest.fixture(scope="session", autouse=True)
def _own_proxy_port():
    real = MilvusTestServer.start

    def start(self):
        if self.port is None:
            self.port = free_port()
        return real(self)

    MilvusTestServer.start = start
    yield
    MilvusTestServer.start = real
