"""Pareto fronts over any recorded metrics, the d_model/L optimum, scaling fits, paired
comparisons between variants, sensitivity to the training axes, and plots."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from sqlalchemy.orm import Session

from cost_model import Variant
from nas_service.api.deps import ResultsDep, SessionDep
from nas_service.api.errors import ApiError, responses
from nas_service.api.jobs import JOB_ERRORS
from nas_service.api.routing import SECURED, ApiRoute
from nas_service.api.schemas import (
    CalibrationRead,
    CompareRead,
    LandscapeRead,
    OptimumRead,
    ParetoRead,
    ScalingRead,
    SensitivityRead,
)
from nas_service.results import plots, queries
from nas_service.results.cache import ResultsCache
from nas_service.results.queries import ParetoAsk
from nas_service.results.queries import calibration as calibrate
from nas_service.spec import OBJECTIVE_METRICS

router = APIRouter(prefix="/v1/jobs", tags=["analysis"], route_class=ApiRoute, dependencies=SECURED)
#: A plot is a PNG; without the trials it needs, a 409.
PNG = {200: {"content": {"image/png": {}}, "description": "A PNG image"}} | responses(
    401, 404, 409, 422, 503
)
#: A read that can find nothing to answer yet (a comparison without a shared shape) or a job
#: it cannot answer for (a stored spec this version no longer reads): a 409.
JOB_CONFLICT = responses(401, 404, 409, 422, 503)


def parse_metrics(metrics: str) -> list[str]:
    """Comma-separated known metrics (spaces around each allowed), at least two distinct; a
    metric named again is ignored. Exactly what `METRICS_PATTERN` documents."""
    names = [m.strip(" ") for m in metrics.split(",")]
    unknown = [m for m in names if m not in OBJECTIVE_METRICS]
    if unknown:
        raise ApiError(
            422,
            f"unknown metric {unknown[0]!r}; expected val_loss, val_bpb or a cost metric",
            "metrics",
        )
    names = list(dict.fromkeys(names))
    if len(names) < 2:
        raise ApiError(422, "give at least two distinct comma-separated metrics", "metrics")
    return names


def _metrics_pattern() -> str:
    one = "(?:" + "|".join(re.escape(m) for m in OBJECTIVE_METRICS) + ")"
    same = "(" + one + ")"
    # at least two items, each a known metric, and not all of them the same one
    return rf"^(?! *{same} *(?:, *\1 *)*$) *{one} *(?:, *{one} *)+$"


METRICS_PATTERN = _metrics_pattern()


#: Each architecture at its best training setting (the default), or every trial (false).
ProfileQuery = Annotated[
    bool,
    Query(description="true: each architecture at its best training setting; false: every trial"),
]
#: The variant a comparison is made against, as the job names it (`block_attnres/S=4`).
ReferenceQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=100,
        pattern=r"^[a-z_]+(/[A-Za-z]+=[0-9]+)*$",
        description="a residual variant of the job, e.g. baseline or block_attnres/S=4",
    ),
]
LevelQuery = Annotated[
    float, Query(ge=0.5, le=0.999, allow_inf_nan=False, description="the interval's level")
]


@dataclass(frozen=True)
class Comparison:
    """A comparison's request: the job, and `reference` checked against the job's variants."""

    job_id: str
    session: Session
    cache: ResultsCache
    reference: str
    level: float


def _comparison(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    reference: ReferenceQuery = "baseline",
    level: LevelQuery = 0.95,
) -> Comparison:
    """The comparison asked for, its `reference` checked against the job's variants: otherwise
    a 404 naming it (a variant the job does not have, as a trial it does not have; the query's
    form is valid)."""
    known = queries.residual_labels(queries.job_row(session, cache, job_id))
    if known and reference not in known:
        raise ApiError(
            404,
            f"this job has no variant {reference!r}; its variants: {', '.join(known)}",
            "reference",
        )
    return Comparison(job_id, session, cache, reference, level)


ComparisonDep = Annotated[Comparison, Depends(_comparison)]


MetricsQuery = Annotated[
    str,
    Query(
        description="comma-separated, at least two distinct, each minimised",
        json_schema_extra={"pattern": METRICS_PATTERN},
    ),
]


def _pareto_ask(
    metrics: MetricsQuery, variant: Variant | None = None, profile: ProfileQuery = True
) -> ParetoAsk:
    return ParetoAsk(tuple(parse_metrics(metrics)), variant, profile)


ParetoDep = Annotated[ParetoAsk, Depends(_pareto_ask)]


@router.get("/{job_id}/pareto", response_model=ParetoRead, responses=JOB_ERRORS)
def pareto(job_id: str, session: SessionDep, cache: ResultsDep, ask: ParetoDep) -> Response:
    """Sent as encoded once per state of the study (`queries.pareto_json`); `response_model`
    documents it."""
    return Response(queries.pareto_json(session, cache, job_id, ask), media_type="application/json")


@router.get("/{job_id}/optimum", response_model=OptimumRead, responses=JOB_ERRORS)
def optimum(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    bootstrap: Annotated[
        int, Query(ge=0, le=2000, description="draws of the fit for the interval (0: none)")
    ] = 200,
    profile: ProfileQuery = True,
) -> OptimumRead:
    return queries.optimum(session, cache, job_id, bootstrap, profile)


@router.get("/{job_id}/compare", response_model=CompareRead, responses=JOB_CONFLICT)
def compare(job_id: str, asked: ComparisonDep) -> CompareRead:
    """Every variant against `reference`, shape by shape (same n_layers, d_model, heads,
    budget), each at its best training setting: the per-seed paired differences, their mean,
    a Student-t interval and a verdict; across shapes, the difference against depth and the
    smallest depth from which the variant is reliably better (the crossover)."""
    return queries.compare(asked.session, asked.cache, job_id, asked.reference, asked.level)


@router.get("/{job_id}/sensitivity", response_model=SensitivityRead, responses=JOB_ERRORS)
def sensitivity(job_id: str, session: SessionDep, cache: ResultsDep) -> SensitivityRead:
    """Per variant, the loss against each training axis for every shape, the best learning
    rate as a function of d_model and depth, and a flag where a shape's best setting lies at
    the edge of the values tried ("widen lr")."""
    return queries.sensitivity(session, cache, job_id)


@router.get("/{job_id}/scaling", response_model=ScalingRead, responses=JOB_ERRORS)
def scaling(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    reference: Variant | None = None,
    loss: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> ScalingRead:
    return queries.scaling(session, cache, job_id, reference, loss)


@router.get("/{job_id}/landscape", response_model=LandscapeRead, responses=JOB_CONFLICT)
def landscape(job_id: str, session: SessionDep, cache: ResultsDep) -> LandscapeRead:
    """The job recorded as a landscape: its spec and every trial with its parameters, costs,
    settings, per-seed runs (tokens, FLOPs, wall time) and curve, and the corpus identity
    (`depthscope export`). A 409 for a job whose stored spec this version no longer reads."""
    return queries.landscape(session, cache, job_id)


#: Whose measured trials a calibration fits: the job's, or every recent job's of its cluster.
ScopeQuery = Annotated[
    Literal["job", "cluster"],
    Query(description="job: this job's trials; cluster: every recent job of its cluster"),
]


@router.get("/{job_id}/calibration", response_model=CalibrationRead, responses=JOB_ERRORS)
def calibration(
    job_id: str, session: SessionDep, cache: ResultsDep, scope: ScopeQuery = "job"
) -> CalibrationRead:
    """The roofline against the measured steps, per device kind: the fit t ≈ a·compute_s +
    b·memory_s + c (non-negative least squares of the relative error), its cross-validated
    median and p90 relative error beside the raw roofline's, every trial's measured,
    roofline and calibrated step time (`calibrated_step_time_s`), and the measured peak
    memory against the analytic one. A device kind with fewer than `min_trials` measured
    trials is returned with `ready: false` and how many more it needs."""
    return calibrate(session, cache, job_id, scope)


@router.get("/{job_id}/plots/pareto.png", response_class=Response, responses=PNG)
def pareto_plot(job_id: str, session: SessionDep, cache: ResultsDep, ask: ParetoDep) -> Response:
    png = plots.pareto_png(session, cache, job_id, ask)
    return Response(png, media_type="image/png")


@router.get("/{job_id}/plots/optimum.png", response_class=Response, responses=PNG)
def optimum_plot(
    job_id: str, session: SessionDep, cache: ResultsDep, profile: ProfileQuery = True
) -> Response:
    return Response(plots.optimum_png(session, cache, job_id, profile), media_type="image/png")


@router.get("/{job_id}/plots/compare.png", response_class=Response, responses=PNG)
def compare_plot(job_id: str, asked: ComparisonDep) -> Response:
    png = plots.compare_png(asked.session, asked.cache, job_id, asked.reference, asked.level)
    return Response(png, media_type="image/png")


@router.get("/{job_id}/plots/calibration.png", response_class=Response, responses=PNG)
def calibration_plot(
    job_id: str, session: SessionDep, cache: ResultsDep, scope: ScopeQuery = "job"
) -> Response:
    """Predicted against measured step time (log-log, the y = x line): the raw roofline and
    the calibrated model's cross-validated predictions; a 409 before any measured trial."""
    return Response(plots.calibration_png(session, cache, job_id, scope), media_type="image/png")
