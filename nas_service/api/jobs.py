"""Jobs and their trials: submit, list, read (progress, compute, ETA), cancel, trials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Body, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cost_model import VARIANTS
from nas_service.api.deps import ResultsDep, SessionDep, SessionFactoryDep, SettingsDep
from nas_service.api.errors import ApiError, responses
from nas_service.api.routing import BODY_KEY, SECURED, ApiRoute
from nas_service.api.schemas import Compute, JobList, JobRead, Progress, TrialList, TrialRead
from nas_service.db import JOB_STATES, Job
from nas_service.jobs import cancel_job, get_job, submit_job
from nas_service.results import JobResults, ResultsCache
from nas_service.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=ApiRoute, dependencies=SECURED)
TRIAL_STATES = ("complete", "pruned", "failed", "running", "waiting")
JobState = Literal[JOB_STATES]  # type: ignore[valid-type]
TrialState = Literal[TRIAL_STATES]  # type: ignore[valid-type]
Variant = Literal[VARIANTS]  # type: ignore[valid-type]
#: The largest offset of a page (a bound, so no query is ever asked for an absurd one).
MAX_OFFSET = 1_000_000_000
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
#: A job route reads the database; its job may not exist.
JOB_ERRORS = responses(401, 404, 422, 503)


def _example() -> dict[str, Any]:
    """The README's job (examples/quick.yaml) as the request body's OpenAPI example."""
    path = Path(__file__).resolve().parents[2] / "examples" / "quick.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {"quick": {"summary": "baseline vs Block AttnRes at fixed compute", "value": data}}


def read_job_row(session: Session, cache: ResultsCache, job_id: str) -> Job:
    """The job's row, read at most every `results_fresh_s` (a cancel here forgets it)."""
    job: Job = cache.recent(("job", job_id), lambda: get_job(session, job_id))
    return job


def job_results(cache: ResultsCache, job: Job) -> JobResults:
    spec = job.spec
    budget = spec["budget"].get("flops") or spec["budget"].get("tokens")
    single = None if isinstance(budget, list) else float(budget)
    return cache.get(job.study_name, list(spec["objectives"]), single)


def read_job(job: Job, results: JobResults) -> JobRead:
    rows = [r for r in results.rows if not r.lost]
    counted = results.counted()
    outcome = [r.outcome for r in counted]
    spec = job.spec
    budget = spec["budget"]
    kind = "flops" if budget.get("flops") is not None else "tokens"
    values = budget[kind] if isinstance(budget[kind], list) else [budget[kind]]
    per_trial = sum(values) / len(values) * spec.get("seeds", 1)
    key = "flops_spent" if kind == "flops" else "tokens_seen"
    spent = sum(t.get(key, 0.0) or 0.0 for r in rows for t in r.train)
    total = per_trial * job.n_trials
    trained = [r.duration_s for r in counted if r.state == "complete" and r.duration_s]
    remaining = job.n_trials - len(counted)
    eta = None
    if job.status in ("pending", "running") and trained:
        eta = sum(trained) / len(trained) * remaining / max(1, spec.get("max_concurrent", 1))
    return JobRead(
        id=job.id,
        name=job.name,
        status=job.status,
        n_trials=job.n_trials,
        study_name=job.study_name,
        objectives=list(spec["objectives"]),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=job.error,
        progress=Progress(
            counted=len(counted),
            completed=sum(1 for r in counted if r.state == "complete"),
            running=sum(1 for r in rows if r.state == "running"),
            pruned=outcome.count("pruned"),
            infeasible=outcome.count("infeasible") + outcome.count("over_constraint"),
            failed=outcome.count("failed") + outcome.count("cancelled"),
            diverged=outcome.count("diverged"),
        ),
        compute=Compute(
            kind=kind, spent=spent, budget=total, fraction=spent / total if total else 0.0
        ),
        eta_s=eta,
        spec=spec,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRead,
    responses=responses(401, 413, 422, 429, 503),
)
def create(
    request: Request,
    body: Annotated[JobSpec, Body(openapi_examples=_example())],
    settings: SettingsDep,
    sessions: SessionFactoryDep,
    cache: ResultsDep,
) -> JobRead:
    """Validate the spec (a refusal is a 422 naming the field), then store the job, pending,
    unless `max_concurrent_jobs` jobs are active (429). Nothing is stored on refusal."""
    spec = strict_spec(request.scope.get(BODY_KEY), body)
    job = submit_job(sessions, settings, spec, storage=cache.storage)
    return read_job(job, job_results(cache, job))


def strict_spec(raw: Any, spec: JobSpec) -> JobSpec:
    """The spec validated strictly, as its schema reads: no string for a number, no boolean
    for an integer (pydantic's lax mode, which `JobSpec` uses, converts them)."""
    if raw is None:
        return spec
    try:
        return JobSpec.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None


@router.get("", response_model=JobList, responses=responses(401, 422, 503))
def list_jobs(
    session: SessionDep,
    cache: ResultsDep,
    status_: Annotated[JobState | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Offset = 0,
) -> JobList:
    query = select(Job)
    if status_ is not None:
        if status_ not in JOB_STATES:
            raise ApiError(
                422,
                f"unknown status {status_!r}; expected one of {', '.join(JOB_STATES)}",
                "status",
            )
        query = query.where(Job.status == status_)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    jobs = session.scalars(query.order_by(Job.created_at.desc()).limit(limit).offset(offset)).all()
    return JobList(
        items=[read_job(j, job_results(cache, j)) for j in jobs],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/{job_id}", response_model=JobRead, responses=JOB_ERRORS)
def read(job_id: str, session: SessionDep, cache: ResultsDep) -> JobRead:
    job = read_job_row(session, cache, job_id)
    return read_job(job, job_results(cache, job))


@router.post(
    "/{job_id}/cancel", response_model=JobRead, responses=responses(401, 404, 409, 422, 503)
)
def cancel(job_id: str, sessions: SessionFactoryDep, cache: ResultsDep) -> JobRead:
    job = cancel_job(sessions, job_id)
    cache.forget(("job", job_id))
    return read_job(job, job_results(cache, job))


@router.get("/{job_id}/trials", response_model=TrialList, responses=JOB_ERRORS)
def trials(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    state: TrialState | None = None,
    variant: Variant | None = None,
    curve: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> TrialList:
    if state is not None and state not in TRIAL_STATES:
        raise ApiError(
            422, f"unknown state {state!r}; expected one of {', '.join(TRIAL_STATES)}", "state"
        )
    if variant is not None and variant not in VARIANTS:
        raise ApiError(422, f"unknown variant {variant!r}", "variant")
    job = read_job_row(session, cache, job_id)
    rows = [
        r
        for r in job_results(cache, job).rows
        if (state is None or r.state == state) and (variant is None or r.variant == variant)
    ]
    page = rows[offset : offset + limit]
    return TrialList(
        items=[TrialRead(**r.as_dict(curve)) for r in page],
        total=len(rows),
        limit=limit,
        offset=offset,
    )
