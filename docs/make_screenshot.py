"""Re-make docs/search-page.png: serve an index, search it in chromium, open a heat map, screenshot.

    python docs/make_screenshot.py INDEX "a dog runs on the grass" --word dog
"""

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("query")
    ap.add_argument("--word", help="the word chip to hover (default: the first)")
    ap.add_argument("--result", type=int, default=0, help="which result to open (0 = the best)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("search-page.png")))
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-m", "vlmatch.cli", "serve", a.index, "--port", str(port),
                               "--log-level", "warning"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(base + "/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 860})
            page.goto(f"{base}/?q={httpx.QueryParams({'q': a.query})['q']}")
            page.wait_for_selector("#results .card")
            page.wait_for_function("() => [...document.querySelectorAll('#results img')].every(i => i.complete)")
            page.locator("#results .card").nth(a.result).click()
            page.wait_for_selector("#chips .chip")
            page.wait_for_function("() => document.getElementById('big').complete")
            chip = page.locator("#chips .chip", has_text=a.word).first if a.word else page.locator("#chips .chip").first
            chip.hover()
            time.sleep(0.3)
            page.screenshot(path=a.out)
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    print(a.out)


if __name__ == "__main__":
    main()
