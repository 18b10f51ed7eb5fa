"""A served index as the tests reach it: a free loopback port, the wait for ``vlmatch serve`` to answer /health
(failing with the server's own words when it exits first), and a browser page that records the page's errors."""

from __future__ import annotations

import socket
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc, base: str, seconds: float, output) -> dict:
    """The /health answer of the server process ``proc`` at ``base`` once it gives one; fails the test when the
    process exits first (with ``output()``, what it printed) or after ``seconds``."""
    import httpx

    deadline = time.time() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vlmatch serve exited with {proc.returncode}: {output()}")
        try:
            answer = httpx.get(base + "/health", timeout=2)
            answer.raise_for_status()
            return answer.json()
        except httpx.HTTPError:
            if time.time() > deadline:
                pytest.fail(f"vlmatch serve did not answer /health within {seconds:g} s")
            time.sleep(0.1)


def watched_page(browser, responses: bool = True):
    """(a desktop-sized page of ``browser``, the list its script errors -- and, with ``responses``, its HTTP
    answers of 400 or more -- are appended to)."""
    page = browser.new_page(viewport={"width": 1200, "height": 820})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if responses:
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return page, errors
