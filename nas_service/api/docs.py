"""`/docs`: the API explorer (Swagger UI) from the service's own files.

FastAPI's default page loads Swagger UI's scripts and styles from a public CDN, on the
dashboard's origin, where the dashboard keeps its token in sessionStorage: any script that
CDN served would run with access to it. Here the page and Swagger UI (vendored, unchanged,
under `swagger/`, see its VERSION) come from the service, and the page's Content-Security-
Policy allows scripts, styles and connections from this origin alone. FastAPI's ReDoc page
(also from a CDN) is not served."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from nas_service.dashboard import page_headers

SWAGGER = Path(__file__).resolve().parent / "swagger"
#: Where the explorer's files are served.
DOCS_STATIC_URL = "/docs/static"
#: Swagger UI draws its icons from data: URIs.
HEADERS = page_headers("'self' data:")

router = APIRouter(include_in_schema=False)


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    """The explorer's page (no token to load it: "Authorize" asks for one)."""
    return HTMLResponse((SWAGGER / "index.html").read_text(encoding="utf-8"), headers=HEADERS)


def install(app: FastAPI) -> None:
    """Serve the page at `/docs` and its files under `DOCS_STATIC_URL`."""
    app.include_router(router)
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=SWAGGER), name="docs")
