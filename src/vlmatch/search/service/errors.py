"""The one error the service's own code raises: :class:`ApiError` becomes the JSON answer
``{"error": code, "detail": message}`` with its status (the app's handler words it, :mod:`.routes`)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers

