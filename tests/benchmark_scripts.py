"""Loading a script of one of the rooms (benchmarks/, experiments/, release/) as a module, for the tests of its pure
parts (plans, tables, verdicts)."""

import importlib.util
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
    """<room>/<name>.py as a fresh module (each call runs it again: state never leaks between tests)."""
    spec = importlib.util.spec_from_file_location(as_name or name, script_path(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
