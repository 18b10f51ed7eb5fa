"""vlmatch_lab.milvus_server, the Milvus server helper of the tests and of benchmarks/milvus.py: it finds the server
package ``milvus`` even where a script named milvus.py stands first on the path, without changing the path."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmark_scripts import BENCHMARKS
from vlmatch_lab import milvus_server


def test_a_milvus_py_first_on_the_path_is_passed_over(tmp_path, monkeypatch):
    if milvus_server.why_not():
        pytest.skip(milvus_server.why_not())
    (tmp_path / "milvus.py").write_text("NOT_THE_SERVER = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "milvus", raising=False)
    before = list(sys.path)
    package = milvus_server.server_package()
    assert hasattr(package, "MilvusServer") and not hasattr(package, "NOT_THE_SERVER")
    assert sys.modules["milvus"] is package and milvus_server.server_package() is package
    assert sys.path == before


def test_a_plain_module_already_imported_as_milvus_is_named_not_used(tmp_path, monkeypatch):
    (tmp_path / "milvus.py").write_text("NOT_THE_SERVER = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "milvus", raising=False)
    import milvus  # the plain module

    assert milvus.NOT_THE_SERVER
    with pytest.raises(ImportError, match="already imported from .*milvus.py"):
        milvus_server.server_package()


def test_the_benchmark_run_as_a_script_imports_the_helper_not_itself():
    """``python benchmarks/milvus.py``: its folder is first on the path, as for every script."""
    if milvus_server.why_not():
        pytest.skip(milvus_server.why_not())
    code = "from vlmatch_lab.milvus_server import server_package; print(server_package().__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = Path(out.stdout.strip())
    assert found.parts[-2:] == ("milvus", "__init__.py") and BENCHMARKS not in found.parents
