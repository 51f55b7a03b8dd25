"""`create_app(settings)`: the HTTP API, versioned under /v1, OpenAPI at /docs.

With `run_clusters`, the app also starts one runner process per named cluster (the
`depthscope serve` default: the local one) and stops them on shutdown; a runner restarted
after a crash resumes its jobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from nas_service.api import analysis, cost, errors, health, jobs
from nas_service.api.deps import require_token
from nas_service.db import make_engine, make_sessionmaker, upgrade
from nas_service.jobs import optuna_storage
from nas_service.results import ResultsCache
from nas_service.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, run_clusters: Sequence[str] = ()) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upgrade(settings.database_url)
        engine = make_engine(settings.database_url)
        app.state.sessions = make_sessionmaker(engine)
        app.state.results = ResultsCache(optuna_storage(settings.database_url))

        def start(name: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, "-m", "nas_service.runner", "--cluster", name, "--forever"],
                env=os.environ | {"DEPTHSCOPE_DATABASE_URL": settings.database_url},
            )

        app.state.runners = {name: start(name) for name in run_clusters}

        async def supervise() -> None:
            """Restart a runner that died; it resumes its jobs (`Runner.recover`)."""
            while True:
                await asyncio.sleep(5)
                for name, proc in list(app.state.runners.items()):
                    if proc.poll() is not None:
                        log.warning(
                            "runner for %s exited with %s; restarting", name, proc.returncode
                        )
                        app.state.runners[name] = start(name)

        supervisor = asyncio.create_task(supervise()) if run_clusters else None
        try:
            yield
        finally:
            if supervisor is not None:
                supervisor.cancel()
            for proc in app.state.runners.values():
                proc.terminate()
            for proc in app.state.runners.values():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            engine.dispose()

    app = FastAPI(
        title="depthscope",
        version="0.1.0",
        description="Architecture search and cost modelling for Transformer residual connections.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runners = {}
    errors.install(app)

    @app.middleware("http")
    async def limit_size(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_request_bytes:
            body = errors.error_body(
                413, f"request body over {settings.max_request_bytes} bytes", "body"
            )
            return JSONResponse(body, status_code=413)
        return await call_next(request)

    secured = [Depends(require_token)]
    app.include_router(health.router)  # health needs no token; /metrics does (below)
    for router in (jobs.router, analysis.router, cost.router, health.metrics_router):
        app.include_router(router, dependencies=secured)
    return app
