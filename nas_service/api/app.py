"""`create_app(settings)`: the HTTP API, versioned under /v1, OpenAPI at /openapi.json and
its explorer at /docs (`api/docs.py`: from the service's own files, no CDN), and the web
dashboard at / (`nas_service.dashboard`; its reads in `api/dashboard_api.py`).

With `run_clusters`, the app also starts one runner process per named cluster (the
`depthscope serve` default: the local one) and stops them on shutdown; a runner restarted
after a crash resumes its jobs (`nas_service.runner.supervisor`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.routing import APIRoute

from nas_service import dashboard
from nas_service.api import analysis, cost, dashboard_api, docs, errors, health, jobs
from nas_service.api.routing import BodyLimit, RequestTimer
from nas_service.results.cache import ResultsCache
from nas_service.runner.supervisor import Supervisor
from nas_service.settings import Settings, get_settings
from nas_service.store import make_engine, make_sessionmaker, upgrade
from nas_service.store.jobs import optuna_storage
from nas_service.store.optuna_compat import check_optuna

log = logging.getLogger(__name__)


def create_app(settings: Settings, run_clusters: Sequence[str] = ()) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_optuna(settings.database_url)  # refuses an untested Optuna or schema
        upgrade(settings.database_url)
        engine = make_engine(
            settings.database_url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            pool_timeout=settings.db_pool_timeout_s,
        )
        app.state.sessions = make_sessionmaker(engine)
        # the threads that end request transactions: one per connection the pool can lend
        app.state.session_threads = anyio.CapacityLimiter(
            max(1, settings.db_pool_size + settings.db_max_overflow)
        )
        app.state.results = ResultsCache(
            optuna_storage(settings.database_url, settings),
            fresh_s=settings.results_fresh_s,
            job_runs=True,
        )

        supervisor = Supervisor(settings.database_url, run_clusters)
        app.state.runners = supervisor.processes  # health reads them
        supervisor.start()
        try:
            yield
        finally:
            supervisor.stop()
            engine.dispose()

    app = FastAPI(
        title="depthscope",
        version="0.1.0",
        description="Architecture search and cost modelling for Transformer residual connections.",
        lifespan=lifespan,
        # the explorer is served from the service's own files (`api/docs.py`), not a CDN
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.state.settings = settings
    app.state.runners = {}
    app.state.metrics = health.metrics_registry(app)
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestTimer, histogram=app.state.request_seconds)  # outermost

    routers = (
        health.router,
        jobs.router,
        analysis.router,
        cost.router,
        dashboard_api.router,
        health.metrics_router,
    )
    for router in routers:  # health needs no token; the others declare it (`routing.SECURED`)
        app.include_router(router)
    dashboard.install(app)  # the page at / and its files (no token: the page asks for it)
    docs.install(app)  # the API explorer at /docs, from the service's own files
    every = (*routers, dashboard.router)
    app.state.routes = [r for router in every for r in router.routes if isinstance(r, APIRoute)]
    if settings.api_token is None:
        app.openapi = lambda: _open_document(app)  # type: ignore[method-assign]
    return app


def _open_document(app: FastAPI) -> dict[str, Any]:
    """Without a configured token nothing asks for one: the document says so (no security
    requirement and no 401), so it describes what this server does."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                operation.pop("security", None)
                operation.get("responses", {}).pop("401", None)
        document.get("components", {}).pop("securitySchemes", None)
        app.openapi_schema = document
    return app.openapi_schema


def from_environment() -> FastAPI:
    """`uvicorn --factory nas_service.api.app:from_environment`: the API alone (no runner;
    jobs stay pending), with the settings from the environment (`DEPTHSCOPE_*`)."""
    return create_app(get_settings())
