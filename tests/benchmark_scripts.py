"""Loading a script of one of the rooms (benchmarks/, experiments/, release/) as a module, for the tests of its pure
parts (plans, tables, verdicts)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
EXPERIMENTS = ROOT / "experiments"
RELEASE = ROOT / "release"
ROOMS = (BENCHMARKS, EXPERIMENTS, RELEASE)


def script_path(name: str) -> Path:
    """<room>/<name>.py, in whichever room holds it."""
    found = [room / f"{name}.py" for room in ROOMS if (room / f"{name}.py").is_file()]
    if len(found) != 1:
        raise FileNotFoundError(f"{name}.py: in {len(found)} of the rooms {[r.name for r in ROOMS]}")
    return found[0]


def load_script(name: str, as_name: str | None = None):
    """<room>/<name>.py as a fresh module (each call runs it again: state never leaks between tests). Its room's folder
    is first on the path while it runs, as when ``python <room>/<name>.py`` runs it (its imports of the modules beside
    it), and off it afterwards (benchmarks/milvus.py is not the ``milvus`` package): a test that calls a function
    importing a module beside it on first use puts the room on the path itself (``monkeypatch.syspath_prepend``)."""
    path = script_path(name)
    spec = importlib.util.spec_from_file_location(as_name or name, path)
    mod = importlib.util.module_from_spec(spec)
    before = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = before
    return mod
