"""Loading a script of benchmarks/ as a module, for the tests of its pure parts (plans, tables, verdicts)."""

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str, as_name: str | None = None):
    """benchmarks/<name>.py as a fresh module (each call runs it again: state never leaks between tests)."""
    spec = importlib.util.spec_from_file_location(as_name or name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
