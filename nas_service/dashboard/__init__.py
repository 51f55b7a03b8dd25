"""The web dashboard: one page (`static/index.html`, plain ES modules, no build step) served
by the service itself at `/`, its files at `/dashboard/static/`, charts drawn by Apache
ECharts vendored under `static/vendor/echarts/` (the machines have no internet: nothing comes
from a CDN). The page reads the API with the token the user enters (kept in the browser's
sessionStorage, sent as the Authorization header, never in a URL).

`install(app)` adds both; the page's own responses carry a Content-Security-Policy that
allows scripts, styles, images and connections from the service alone.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
#: Where the page's files are served.
STATIC_URL = "/dashboard/static"


def page_headers(img_src: str) -> dict[str, str]:
    """The headers of a page the service serves (the dashboard's, the API explorer's): nothing
    from elsewhere, scripts and connections from this origin only, images from `img_src`;
    inline styles are allowed (the chart library's tooltips and Swagger UI set them)."""
    csp = (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        f"img-src {img_src}; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


HEADERS = page_headers("'self' data: blob:")

router = APIRouter(include_in_schema=False)


#: The page's marker of whether the service needs a token (`data-auth="token"`), so that
#: the page asks for it before its first read rather than after a 401.
AUTH_MARK = '<body data-auth="">'


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    """The dashboard's page. It needs no token to load (every read it makes asks for one);
    it says whether the service needs one, which any 401 would say too."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    if request.app.state.settings.api_token is not None:
        page = page.replace(AUTH_MARK, '<body data-auth="token">', 1)
    return HTMLResponse(page, headers=HEADERS)


def install(app: FastAPI) -> None:
    """Serve the page at `/` and its static files under `STATIC_URL`."""
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name="dashboard")
