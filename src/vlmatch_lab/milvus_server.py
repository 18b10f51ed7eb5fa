"""A Milvus standalone server process for the tests and the benchmarks: the embedded server of the PyPI
package ``milvus`` (2.3.5, ``pip install 'vlmatch[milvus-server]'``) started in a folder of its own on free
ports. Only the process this object started is ever stopped or killed (by its pid).

    server = MilvusTestServer(tmp_dir).start()   # 10-15 s
    server.uri                                   # http://127.0.0.1:PORT
    server.kill()                                # kill -9, as a crash
    server.start()                               # the same folder and port: the data is back
    server.stop()
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

_PARTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")

# Test timers: the background loops' timers are sized for big collections, and the tests' tiny ones only wait on
# them (compaction checks every 10 s, the query coordinator's 1 s loops). None changes what is stored or answered.
_TIMERS_ADDED = (  # keys the package's template does not have, inserted under their section
    ("  compaction:\n    enableAutoCompaction: true\n", "    check:\n      interval: 1 # s (10)\n"),
    ("queryCoord:\n", "  checkChannelInterval: 100 # ms (1000)\n  checkSegmentInterval: 100 # ms (1000)\n"),
)
_TIMERS_SET = {"queryCoord.checkInterval": 200, "queryCoord.distPullInterval": 100}  # ms (1000, 500)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_package():
    """The embedded server package ``milvus``, found past a plain ``milvus.py`` (``benchmarks/milvus.py`` would import
    itself); ImportError when it is not installed."""
    known = sys.modules.get("milvus")
    if known is not None and hasattr(known, "MilvusServer"):
        return known
    for entry in sys.path:
        spec = importlib.machinery.PathFinder.find_spec("milvus", [entry or os.getcwd()])
        if spec is not None and spec.origin and spec.origin.endswith("__init__.py"):  # a package, not a milvus.py
            break
    else:
        raise ImportError("no package named 'milvus' (the embedded Milvus server): pip install 'vlmatch[milvus-server]'")
    if known is not None:
        raise ImportError(f"'milvus' is already imported from {known.__file__}, not the embedded Milvus server")
    module = importlib.util.module_from_spec(spec)
    sys.modules["milvus"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["milvus"]
        raise
    return module


def why_not() -> str | None:
    """None when the embedded server can run here, else why not (the reason a skip prints)."""
    try:
        server_package()
    except ImportError:
        return "the Milvus server tests need the embedded server: pip install 'vlmatch[milvus-server]'"
    if not sys.platform.startswith("linux"):
        return f"the embedded Milvus server package ships Linux binaries only (this is {sys.platform})"
    return None


def _bind(port: int):
    """The package's port check, with SO_REUSEADDR as the server's own listeners have."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))  # as the server's parts listen: on every address (a port taken on any is taken)
        sock.listen()
        return sock
    except OSError:
        sock.close()
        return None


# the ports of the server's components in the package's config template (besides the proxy's and etcd's)
PART_PORTS = ("root_coord_port", "proxy_internal_port", "query_coord_port", "query_node_port", "index_coord_port",
              "index_node_port", "data_coord_port", "data_node_port")


class MilvusTestServer:
    def __init__(self, base: Path, auth: bool = False, test_timers: bool = True):
        """``test_timers``: the short background-loop timers above (False: the server's defaults, as a
        benchmark of a real server's build times needs)."""
        self.base, self.auth, self.test_timers = Path(base), auth, test_timers
        self.port: int | None = None
        self.etcd: tuple[int, int] | None = None  # its embedded etcd's client and peer ports
        self.parts: dict[str, int] | None = None  # its components' own ports (PART_PORTS), kept for a restart
        self._server = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        proc = self._server and self._server.server_proc
        return proc.pid if proc else None

    def start(self) -> MilvusTestServer:
        milvus = server_package()
        cfg = milvus.MilvusServerConfig(template=str(self._template()))
        cfg.glog_conf_file = str(Path(milvus.__file__).parent / "data" / "glog.conf")
        cfg.set("etcd_config_path", str(self.base / "etcd-embed.yaml"))
        cfg.update(etcd_port=self.etcd[0])
        if self.parts is None:  # each component on a free port of its own: the package starts each at a fixed
            self.parts = {k: free_port() for k in PART_PORTS}  # default (rootcoord 53100, ...) and only checks it
        cfg.update(**self.parts)  # is free, so two servers starting at once (two test workers) both take it
        cfg.try_bind_port = _bind  # a restart after kill -9 finds its ports in TIME_WAIT: Milvus reuses them
        if self.port is None:  # the package tries 19530, 19531, ... and frees the port before the server listens,
            self.port = free_port()  # so two servers starting at once took the same one: a free port of its own
        cfg.update(proxy_port=self.port)  # a restart keeps its URI
        s = milvus.MilvusServer(cfg)
        s.set_base_dir(str(self.base))
        for c in _PARTS:  # else the parts talk over the host's address
            s.config.set(f"{c}.ip", "127.0.0.1")
        s.config.set("common.gracefulStopTimeout", 3)  # else a SIGTERM may wait 30 minutes
        s.config.set("authorization_enabled", self.auth)
        for key, value in _TIMERS_SET.items() if self.test_timers else ():
            s.config.set(key, value)
        self._server = s
        try:
            s.start()
        except BaseException:
            self.stop()  # a server that did not come up in time is not left behind
            raise
        self.port = s.listen_port
        return self

    def _template(self) -> Path:
        """The package's config template with the embedded etcd's own config file: the package leaves etcd's
        peer port at 2380 (and its client port at 2379), so a second server on the host would not start."""
        milvus = server_package()
        self.base.mkdir(parents=True, exist_ok=True)
        if self.etcd is None:
            self.etcd = (free_port(), free_port())
        client, peer = self.etcd
        (self.base / "etcd-embed.yaml").write_text(
            f"name: default\nlisten-client-urls: http://127.0.0.1:{client}\n"
            f"advertise-client-urls: http://127.0.0.1:{client}\nlisten-peer-urls: http://127.0.0.1:{peer}\n"
            f"initial-advertise-peer-urls: http://127.0.0.1:{peer}\ninitial-cluster: default=http://127.0.0.1:{peer}\n")
        text = (Path(milvus.__file__).parent / "data" / "config.yaml.template").read_text()
        missing = [k for k in PART_PORTS if "{{ " + k + "(int)" not in text]
        assert not missing, f"the milvus package's config template changed: no {missing}"
        marker = "  use:\n    embed: true"
        assert marker in text, "the milvus package's config template changed"
        text = text.replace(marker, "  config:\n    path: {{ etcd_config_path }}\n" + marker, 1)
        for anchor, lines in _TIMERS_ADDED if self.test_timers else ():
            assert text.count(anchor) == 1, f"the milvus package's config template changed: {anchor!r}"
            text = text.replace(anchor, anchor + lines, 1)
        out = self.base / "config.yaml.template"
        out.write_text(text)
        return out

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
