"""The HTTP service over an index (``vlmatch serve``): :func:`create_app` builds the FastAPI app.

Its parts: the app factory (:mod:`.app`), one router per concern (:mod:`.search`, :mod:`.photos`,
:mod:`.explain`, :mod:`.health`, :mod:`.page`) over what they share (:mod:`.context`), the error answers
(:mod:`.errors`), the request and response models (:mod:`.schema`), the middleware that caps bodies
(:mod:`.middleware`), uploaded images (:mod:`.uploads`), the thumbnail and full-view cache (:mod:`.thumbnails`),
and the service layer the routes call -- the index behind a :class:`SearchBackend`, the service's
:class:`Limits` and the bounded model pool (:mod:`.service`).
(The names below are imported on first use: the command line reads :mod:`.service` without FastAPI.)"""

from __future__ import annotations

from ...lazy import lazy_names

_LAZY = {"create_app": ".app", "IndexBackend": ".service", "Limits": ".service", "SearchBackend": ".service"}

__all__ = ["create_app", "IndexBackend", "Limits", "SearchBackend"]


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)
