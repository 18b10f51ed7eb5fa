"""``GET /``: the web page (static/index.html, self-contained: it loads nothing from elsewhere)."""

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()


@cache
def _page() -> str:
    return files("vlmatch.search.service").joinpath("static/index.html").read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def index_page():
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})
