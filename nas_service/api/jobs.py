"""Jobs and their trials: submit, list, read (progress, compute, ETA), cancel, trials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Body, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from cost_model import Variant
from nas_service.api.deps import ResultsDep, SessionDep, SettingsDep
from nas_service.api.errors import responses
from nas_service.api.routing import BODY_KEY, SECURED, ApiRoute
from nas_service.api.schemas import JobList, JobRead, TrialList
from nas_service.jobs import cancel_job, submit_job
from nas_service.results import queries
from nas_service.results.cache import job_results
from nas_service.results.queries import TrialsAsk
from nas_service.spec import JobSpec
from nas_service.store import JobStatus, TrialStatus
from nas_service.store.jobs import get_job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=ApiRoute, dependencies=SECURED)
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
    session: SessionDep,
    cache: ResultsDep,
) -> JobRead:
    """Validate the spec (a refusal is a 422 naming the field), then store the job, pending,
    unless `max_concurrent_jobs` jobs are active (429). Nothing is stored on refusal."""
    spec = strict_spec(request.scope.get(BODY_KEY), body)
    return queries.new_job(submit_job(session, settings, spec, storage=cache.storage))


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
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Offset = 0,
) -> JobList:
    return queries.job_page(session, cache, status_, limit, offset)


@router.get("/{job_id}", response_model=JobRead, responses=JOB_ERRORS)
def read(job_id: str, session: SessionDep, cache: ResultsDep) -> JobRead:
    return queries.read_job(session, cache, job_id)


@router.post(
    "/{job_id}/cancel", response_model=JobRead, responses=responses(401, 404, 409, 422, 503)
)
def cancel(job_id: str, session: SessionDep, cache: ResultsDep) -> JobRead:
    """Cancel the job (in the request's transaction) and show it. Its trials are read first,
    so no read waits while the transaction holds the job's row."""
    results = job_results(cache, get_job(session, job_id))
    job = cancel_job(session, job_id)
    cache.forget(("job", job_id))
    return queries.summarise(job, results)


def _trials_ask(
    state: TrialStatus | None = None,
    variant: Variant | None = None,
    curve: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> TrialsAsk:
    return TrialsAsk(state, variant, curve, limit, offset)


TrialsDep = Annotated[TrialsAsk, Depends(_trials_ask)]


@router.get("/{job_id}/trials", response_model=TrialList, responses=JOB_ERRORS)
def trials(job_id: str, session: SessionDep, cache: ResultsDep, ask: TrialsDep) -> Response:
    """Sent as the rows' encoded reads (`queries.trial_page`); `response_model` documents it."""
    return Response(queries.trial_page(session, cache, job_id, ask), media_type="application/json")
