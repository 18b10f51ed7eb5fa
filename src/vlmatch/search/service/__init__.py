"""The HTTP service over an index (``vlmatch serve``): :func:`create_app` builds the FastAPI app (:mod:`.app`);
the routers, their shared context and checks, and the service layer (:mod:`.service`) are its modules.
(The names below are imported on first use: the command line reads :mod:`.service` without FastAPI.)"""

from __future__ import annotations

from ...lazy import lazy_names

_LAZY = {"create_app": ".app", "IndexBackend": ".service", "Limits": ".service", "SearchBackend": ".service"}

__all__ = ["create_app", "IndexBackend", "Limits", "SearchBackend"]


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)
