"""The page in a real browser: Playwright driving Debian's chromium against a served index.

One server start; the test types a query, waits for the result grid, opens a result's heat maps,
hovers a word chip and checks the overlay is drawn, presses "more", checks the query is in the URL,
and repeats the search on a phone-sized screen. Screenshots go to $VLMATCH_SCREENSHOTS (default: the
test's temp folder). If chromium cannot start, the test fails and says why; it never skips.
"""

import os
from pathlib import Path

import pytest

from ..photo_index import photo_index  # noqa: F401  (the session fixture)
from ..serving import free_port, wait_until_serving, watched_page

CHROMIUM = "/usr/bin/chromium"


def launch(p):
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium; .ci/run does)")
    try:
        return p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
    except Exception as e:  # the reason (missing libraries, sandbox, ...) is in the message
        pytest.fail(f"chromium at {CHROMIUM} did not start: {e}")


def screenshots(tmp_path) -> Path:
    """Where the tests' screenshots go: $VLMATCH_SCREENSHOTS, else the test's temp folder."""
    shots = Path(os.environ.get("VLMATCH_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def overlay_pixels(page) -> int:
    """Pixels of the heat-map canvas that are painted (non-transparent)."""
    return page.evaluate("""() => { const c = document.getElementById('heat');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }""")


def check_page(page, base, shots: Path, tag: str, n_results: int):
    page.goto(base + "/")
    page.fill("#q", "a dog on the grass")
    page.press("#q", "Enter")
    page.wait_for_selector("#results .card")
    cards = page.locator("#results .card")
    assert cards.count() == n_results
    assert "q=a+dog+on+the+grass" in page.url  # the query is in the URL, to share
    first = cards.first
    assert first.locator(".score").inner_text().startswith("#1")
    page.wait_for_function("() => [...document.querySelectorAll('#results img')].every(i => i.complete && i.naturalWidth > 0)")
    page.screenshot(path=str(shots / f"results-{tag}.png"), full_page=False)
    first.click()
    page.wait_for_selector("#chips .chip")
    chips = page.locator("#chips .chip")
    assert [chips.nth(i).inner_text() for i in range(chips.count())][:2] == ["a", "dog"]
    page.wait_for_function("() => document.getElementById('big').complete")
    page.wait_for_selector("#chips .chip.on")  # the viewer opens on the first content word, not on "a"
    assert "on" in chips.nth(1).get_attribute("class") and "fn" in chips.nth(0).get_attribute("class")
    chips.nth(1).hover()
    assert "on" in chips.nth(1).get_attribute("class")
    page.wait_for_function("() => document.getElementById('heat').width > 0")
    assert overlay_pixels(page) > 0
    page.screenshot(path=str(shots / f"heatmap-{tag}.png"), full_page=False)
    page.keyboard.press("Escape")
    return page


@pytest.mark.slow  # an index served in a process of its own and driven by chromium
def test_page_in_chromium(served_index, tmp_path):
    from playwright.sync_api import sync_playwright

    base, n_images = served_index
    shots = screenshots(tmp_path)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page, errors = watched_page(browser)
            external = []
            page.on("request", lambda r: None if r.url.startswith(base) else external.append(r.url))
            check_page(page, base, shots, "desktop", min(12, n_images))
            if n_images > 12:  # "more" asks for the next page
                page.click("#more")
                page.wait_for_function("() => document.querySelectorAll('#results .card').length > 12")
                assert "k=24" in page.url
            # a shared link opens the same results
            page.goto(base + "/?q=a+dog+on+the+grass")
            page.wait_for_selector("#results .card")
            assert page.input_value("#q") == "a dog on the grass"
            phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
            check_page(phone, base, shots, "phone", min(12, n_images))
            width = phone.evaluate("() => document.documentElement.scrollWidth")
            assert width <= 390, f"the page is {width} px wide on a 390 px screen"
            assert not errors, errors
            assert not external, f"the page loaded external assets: {external}"
        finally:
            browser.close()


@pytest.fixture
def served_index(photo_index):  # noqa: F811
    """``vlmatch serve`` on the photo index, in its own process on a free loopback port."""
    yield from serve(photo_index)


def serve(index):
    """``vlmatch serve`` on ``index``, in its own process on a free loopback port: yields (base URL, size)."""
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "vlmatch.cli", "serve", str(index), "--port", str(port),
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, wait_until_serving(proc, base, 60, proc.stdout.read)["index_size"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def dated_index(tmp_path):
    """``vlmatch serve`` on an index of drawn photos with EXIF capture times: photo i taken in month i + 1 of
    2023, camera "Canon" for even i, "Apple" for odd; photos 9 and 10 without a date."""
    from PIL import Image

    from vlmatch.search.build import build_index

    from ..photo_index import draw_photos, save_models

    photos = draw_photos(tmp_path / "photos", 12)
    for i, p in enumerate(sorted(photos.glob("*.jpg"))):
        ex = Image.Exif()
        ex[271] = "Canon" if i % 2 == 0 else "Apple"
        if i not in (9, 10):
            ex.get_ifd(0x8769)[36867] = f"2023:{i + 1:02d}:15 12:00:00"
        with Image.open(p) as im:
            im.load()
        im.save(p, quality=90, exif=ex)
    ck = save_models(tmp_path / "ckpt")
    build_index(tmp_path / "index", ck["model"], images=photos, retriever_ckpt=ck["retriever"],
                backbone="efficientnet-lite0", progress=False)
    yield from serve(tmp_path / "index")


@pytest.mark.slow  # an index built, served in a process of its own and driven by chromium
def test_page_filters_in_chromium(dated_index, tmp_path):
    """The page's filter controls: a date range and a camera narrow the results to the matching photos (the
    dates under each card), go into the URL, and a shared link with them fills the controls again."""
    from playwright.sync_api import sync_playwright

    base, _ = dated_index
    shots = screenshots(tmp_path)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page, errors = watched_page(browser, responses=False)
            page.goto(base + "/")
            page.fill("#q", "a dog on the grass")
            page.press("#q", "Enter")
            page.wait_for_selector("#results .card")
            assert page.locator("#results .card").count() == 12
            page.fill("#f-after", "2023-03-01")
            page.fill("#f-before", "2023-07-31")  # a change searches again
            page.wait_for_function("() => document.querySelectorAll('#results .card').length === 5")
            dates = page.locator("#results .card .when").all_inner_texts()
            assert sorted(d[:10] for d in dates) == [f"2023-{m:02d}-15" for m in range(3, 8)]
            assert "after=2023-03-01" in page.url and "before=2023-07-31" in page.url
            page.fill("#f-camera", "canon")
            page.press("#f-camera", "Enter")  # the form's submit: the query with every filter
            page.wait_for_function("() => document.querySelectorAll('#results .card').length === 3")
            assert all("Canon" in d for d in page.locator("#results .card .when").all_inner_texts())
            page.screenshot(path=str(shots / "filters-desktop.png"), full_page=False)
            page.goto(base + "/?q=a+dog&after=2023-11-01&camera=apple")  # a shared link
            page.wait_for_selector("#results .card")
            assert page.input_value("#f-after") == "2023-11-01" and page.input_value("#f-camera") == "apple"
            assert page.locator("#results .card .when").all_inner_texts() == ["2023-12-15 · Apple"]
            assert not errors, errors
        finally:
            browser.close()
