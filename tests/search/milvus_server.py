"""A Milvus standalone server process for the tests: the embedded server of the PyPI package
``milvus`` (2.3.5, ``pip install 'vlmatch[milvus-server]'``) started in a folder of its own on free
ports. Only the process this object started is ever stopped or killed (by its pid).

    server = MilvusTestServer(tmp_dir).start()   # 10-15 s
    server.uri                                   # http://127.0.0.1:PORT
    server.kill()                                # kill -9, as a crash
    server.start()                               # the same folder and port: the data is back
    server.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

_PARTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")


def why_not() -> str | None:
    """None when the embedded server can run here, else why not (the reason a skip prints)."""
    try:
        import milvus  # noqa: F401
    except ImportError:
        return "the Milvus server tests need the embedded server: pip install 'vlmatch[milvus-server]'"
    import sys

    if not sys.platform.startswith("linux"):
        return f"the embedded Milvus server package ships Linux binaries only (this is {sys.platform})"
    import socket

    with socket.socket() as s:  # its embedded etcd always takes peer port 2380: one such server per host
        try:
            s.bind(("127.0.0.1", 2380))
        except OSError:
            return "port 2380 is taken (another embedded Milvus server runs on this host?)"
    return None


class MilvusTestServer:
    def __init__(self, base: Path, auth: bool = False):
        self.base, self.auth = Path(base), auth
        self.port: int | None = None
        self._server = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        proc = self._server and self._server.server_proc
        return proc.pid if proc else None

    def start(self) -> MilvusTestServer:
        from milvus import MilvusServer, MilvusServerConfig

        cfg = MilvusServerConfig()
        if self.port is not None:  # a restart keeps its URI
            cfg.update(proxy_port=self.port)
        s = MilvusServer(cfg)
        s.set_base_dir(str(self.base))
        for c in _PARTS:  # else the parts talk over the host's address
            s.config.set(f"{c}.ip", "127.0.0.1")
        s.config.set("common.gracefulStopTimeout", 10)  # else a SIGTERM may wait 30 minutes
        s.config.set("authorization_enabled", self.auth)
        s.start()
        self._server = s
        self.port = s.listen_port
        return self

    def kill(self) -> None:
        """kill -9 the server process this object started (a crash: nothing flushed, nothing closed)."""
        pid = self.pid
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        self._server.server_proc.wait(timeout=30)
        self._forget()

    def stop(self) -> None:
        s = self._server
        if s is None or s.server_proc is None:
            return
        s.server_proc.send_signal(signal.SIGTERM)
        try:
            s.server_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            s.server_proc.kill()
            s.server_proc.wait(timeout=10)
        self._forget()

    def _forget(self) -> None:
        s = self._server
        s.server_proc = None
        for fd in s.proc_fds.values():
            fd.close()
        s.proc_fds.clear()
        self._server = None
