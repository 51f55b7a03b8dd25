"""Health (no authentication) and Prometheus metrics."""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from nas_service.api.errors import responses
from nas_service.api.routing import LATENCY_BUCKETS, SECURED, ApiRoute
from nas_service.store import JOB_STATES, RUN_STATES, Job, JobStatus, RunnerLife, TrialRun
from nas_service.store.lease import lease_holders

#: The text format every Prometheus reads (what `generate_latest` writes).
PROMETHEUS_TEXT = CONTENT_TYPE_PLAIN_0_0_4
router = APIRouter(tags=["health"], route_class=ApiRoute)
metrics_router = APIRouter(tags=["metrics"], route_class=ApiRoute, dependencies=SECURED)


class HealthRead(BaseModel):
    """`status` ok or degraded (then the answer is a 503); the database, the runners (alive
    or not), whether each runner's Ray is ready (`runner_ray`: ready, connecting, waiting
    for the lease, starting, stopped, or unknown while the database does not answer) and
    each configured remote Ray head (reachable or not). The runners are every runner of the
    database (its lease rows, `nas_service.store.lease.lease_holders`) and those this
    service started (`nas_service.runner.supervisor`), which may not hold a lease yet."""

    model_config = ConfigDict(extra="forbid")

    status: str
    database: str
    runners: dict[str, bool] | None = None
    runner_ray: dict[str, str] | None = None
    ray: dict[str, str] | None = None


@router.get(
    "/v1/health",
    response_model=HealthRead,
    responses={503: {"model": HealthRead, "description": "Degraded"}},
)
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
    database = body["database"] == "ok"
    leased = _leased(request) if database else {}
    if runners or leased:
        alive = {name: held[0] for name, held in leased.items()}
        alive |= {name: proc.poll() is None for name, proc in runners.items()}
        body["runners"] = dict(sorted(alive.items()))
        ready = {name: held[1] for name, held in leased.items()}
        ready |= _runner_ray(request, runners) if database else {}
        body["runner_ray"] = {name: ready.get(name, "unknown") for name in body["runners"]}
        if not all(alive.values()) or any(v != "ready" for v in body["runner_ray"].values()):
            body["status"] = "degraded"
    remote = {
        name: _reachable(cluster.address)
        for name, cluster in request.app.state.settings.clusters.items()
        if cluster.address is not None
    }
    if remote:
        body["ray"] = {name: "ok" if ok else "unreachable" for name, ok in remote.items()}
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


def _leased(request: Request) -> dict[str, tuple[bool, str]]:
    """Every runner of the database, alive or not, and where it stands (its lease row)."""
    try:
        return lease_holders(request.app.state.sessions)
    except Exception:  # report, do not raise: health must answer
        return {}


def _runner_ray(request: Request, runners: dict[str, Any]) -> dict[str, str]:
    """Where each runner process of this service stands, from its life row (the runner
    writes when it took the lease and when its Ray answered; `nas_service.store.lease`)."""
    host = socket.gethostname()[:255]
    states = {}
    try:
        with request.app.state.sessions() as session:
            for name, proc in runners.items():
                life = session.scalars(
                    select(RunnerLife)
                    .where(
                        RunnerLife.cluster == name,
                        RunnerLife.pid == proc.pid,
                        RunnerLife.host == host,
                    )
                    .order_by(RunnerLife.id.desc())
                    .limit(1)
                ).first()
                if life is None or life.ended_at is not None:
                    states[name] = "starting" if proc.poll() is None else "stopped"
                elif life.ray_ready_at is not None:
                    states[name] = "ready"
                elif life.acquired_at is not None:
                    states[name] = "connecting"
                else:
                    states[name] = "waiting for the lease"
    except Exception:  # report, do not raise: health must answer
        return {}
    return states


def _reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether a configured Ray head's GCS port accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class DatabaseCollector(Collector):
    """Job, trial-run and queue gauges and the trial-duration summary, read from the database
    at scrape time (the runner writes them; the API process keeps no counters of its own)."""

    def __init__(self, sessions: Callable[[], sessionmaker[Session]]) -> None:
        self.sessions = sessions

    def describe(self) -> Iterable[Metric]:
        return []  # collected on scrape only (registering must not read the database)

    def collect(self) -> Iterable[Metric]:
        with self.sessions()() as session:
            jobs = dict(
                session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
            )
            runs = dict(
                session.execute(select(TrialRun.state, func.count()).group_by(TrialRun.state)).all()
            )
            spans = session.execute(
                select(TrialRun.started_at, TrialRun.finished_at).where(
                    TrialRun.finished_at.is_not(None)
                )
            ).all()
            durations = [(end - start).total_seconds() for start, end in spans if end is not None]
        by_job = GaugeMetricFamily("depthscope_jobs", "Jobs by state.", labels=["state"])
        for job_state in JOB_STATES:
            by_job.add_metric([job_state], jobs.get(job_state, 0))
        yield by_job
        by_run = GaugeMetricFamily(
            "depthscope_trial_runs", "Trial attempts by state.", labels=["state"]
        )
        for run_state in RUN_STATES:
            by_run.add_metric([run_state], runs.get(run_state, 0))
        yield by_run
        yield GaugeMetricFamily(
            "depthscope_queue_depth", "Jobs waiting to start.", value=jobs.get(JobStatus.PENDING, 0)
        )
        yield SummaryMetricFamily(
            "depthscope_trial_duration_seconds",
            "Wall time of finished trial attempts.",
            count_value=len(durations),
            sum_value=math.fsum(durations),
        )


def metrics_registry(app: FastAPI) -> CollectorRegistry:
    """The app's own registry (never the process-global one: two apps, two registries)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(lambda: app.state.sessions))
    app.state.request_seconds = Histogram(
        "depthscope_http_request_duration_seconds",
        "Time from a request's arrival to the end of its answer, per route template.",
        ("route", "method", "status"),
        registry=registry,
        buckets=LATENCY_BUCKETS,
    )
    return registry


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text (0.0.4)",
        },
        **responses(401, 503),
    },
)
def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics
    return Response(generate_latest(registry), media_type=PROMETHEUS_TEXT)
