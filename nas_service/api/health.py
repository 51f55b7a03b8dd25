"""Health (no authentication) and Prometheus metrics."""

from __future__ import annotations

import socket
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import func, select, text

from nas_service.api.deps import SessionDep
from nas_service.db import JOB_STATES, RUN_STATES, Job, TrialRun

router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["metrics"])


@router.get("/v1/health")
def health(request: Request) -> JSONResponse:
    body: dict[str, Any] = {"status": "ok"}
    try:
        with request.app.state.sessions() as session:
            session.execute(text("SELECT 1"))
        body["database"] = "ok"
    except Exception as exc:  # report, do not raise: health must answer
        body["database"] = f"unreachable: {type(exc).__name__}"
        body["status"] = "degraded"
    runners = request.app.state.runners
    if runners:
        alive = {name: proc.poll() is None for name, proc in runners.items()}
        body["runners"] = alive  # a live runner holds its Ray connection (it exits without)
        if not all(alive.values()):
            body["status"] = "degraded"
    remote = {
        name: _reachable(cluster.address)
        for name, cluster in request.app.state.settings.clusters.items()
        if cluster.address is not None
    }
    if remote:
        body["ray"] = {name: "ok" if ok else "unreachable" for name, ok in remote.items()}
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


def _reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether a configured Ray head's GCS port accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


@metrics_router.get("/metrics", response_class=PlainTextResponse)
def metrics(session: SessionDep) -> str:
    jobs = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    runs = dict(
        session.execute(select(TrialRun.state, func.count()).group_by(TrialRun.state)).all()
    )
    durations = [
        (r.finished_at - r.started_at).total_seconds()
        for r in session.scalars(select(TrialRun).where(TrialRun.finished_at.is_not(None)))
    ]
    lines = [
        "# HELP depthscope_jobs Jobs by state.",
        "# TYPE depthscope_jobs gauge",
        *(f'depthscope_jobs{{state="{s}"}} {jobs.get(s, 0)}' for s in JOB_STATES),
        "# HELP depthscope_trial_runs Trial attempts by state.",
        "# TYPE depthscope_trial_runs gauge",
        *(f'depthscope_trial_runs{{state="{s}"}} {runs.get(s, 0)}' for s in RUN_STATES),
        "# HELP depthscope_trial_duration_seconds Wall time of finished trial attempts.",
        "# TYPE depthscope_trial_duration_seconds summary",
        f"depthscope_trial_duration_seconds_count {len(durations)}",
        f"depthscope_trial_duration_seconds_sum {sum(durations):.3f}",
        "# HELP depthscope_queue_depth Jobs waiting to start.",
        "# TYPE depthscope_queue_depth gauge",
        f"depthscope_queue_depth {jobs.get('pending', 0)}",
    ]
    return "\n".join(lines) + "\n"
