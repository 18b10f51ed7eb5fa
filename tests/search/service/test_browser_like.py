"""The page's "more like this" in a real browser (Playwright + Debian's chromium), against a served index:
a result's button searches by that photo (itself first, the id in the URL), a text typed then searches for
both, and the chip's x goes back to the text alone."""

import pytest

from ..photo_index import photo_index  # noqa: F401  (the session fixture)
from ..serving import watched_page
from .test_browser import launch, served_index  # noqa: F401  (served_index: the fixture)


def card_ids(page) -> list[int]:
    return page.evaluate("() => [...document.querySelectorAll('#results .card')].map((c) => Number(c.dataset.id))")


@pytest.mark.slow  # an index served in a process of its own and driven by chromium
def test_more_like_this_in_chromium(served_index):  # noqa: F811
    from playwright.sync_api import sync_playwright

    base, n_images = served_index
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page, errors = watched_page(browser)
            page.goto(base + "/")
            page.fill("#q", "a dog on the grass")
            page.press("#q", "Enter")
            page.wait_for_selector("#results .card")
            third = page.locator("#results .card").nth(2)
            liked = int(third.get_attribute("data-id"))
            liked_name = third.locator(".name").inner_text()
            third.locator(".like").click()
            page.wait_for_url(f"**like={liked}**")
            page.wait_for_function(f"() => Number(document.querySelector('#results .card').dataset.id) === {liked}")
            assert "q=" not in page.url and page.input_value("#q") == ""
            assert page.is_visible("#likechip") and liked_name in page.inner_text("#likechip")
            assert len(card_ids(page)) == min(12, n_images)
            # a result of a search by photo opens without heat maps (no words), and says so
            page.locator("#results .card .open").first.click()
            page.wait_for_selector("#viewer.open")
            assert "no words" in page.inner_text("#chips")
            page.click("#close")
            # like this one, but matching a text
            page.fill("#q", "a red ball in the park")
            page.press("#q", "Enter")
            page.wait_for_url("**q=a+red+ball**")
            assert f"like={liked}" in page.url
            page.wait_for_selector("#results .card")
            # the chip's x: back to the text alone
            page.click("#unlike")
            page.wait_for_function("() => !location.search.includes('like=')")
            assert not page.is_visible("#likechip")
            # a shared link of a search by photo opens it
            page.goto(base + f"/?like={liked}")
            page.wait_for_function(f"() => Number(document.querySelector('#results .card')?.dataset.id) === {liked}")
            assert not errors, errors
        finally:
            browser.close()
