"""Names a package exports but imports on first use (PEP 562), so that importing the package stays light
(``vlmatch --help`` answers without torch; benchmarks/cold_start.py measures it)."""

from __future__ import annotations

import importlib


def lazy_names(package: str, namespace: dict, table: dict[str, str]):
    """``(__getattr__, __dir__)`` for package ``package`` whose globals are ``namespace``: each name of ``table``
    (name -> relative module) is imported from its module when first asked for, then kept in the namespace."""

    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
