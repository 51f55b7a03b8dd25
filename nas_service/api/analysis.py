"""Pareto fronts over any recorded metrics, the d_model/L optimum, scaling fits, and plots."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from cost_model import Variant
from nas_service import queries
from nas_service.api.deps import ResultsDep, SessionDep
from nas_service.api.errors import ApiError, responses
from nas_service.api.jobs import JOB_ERRORS
from nas_service.api.routing import SECURED, ApiRoute
from nas_service.api.schemas import OptimumRead, ParetoRead, ScalingRead
from nas_service.spec import OBJECTIVE_METRICS

router = APIRouter(prefix="/v1/jobs", tags=["analysis"], route_class=ApiRoute, dependencies=SECURED)
#: A plot is a PNG; without the trials it needs, a 409.
PNG = {200: {"content": {"image/png": {}}, "description": "A PNG image"}} | responses(
    401, 404, 409, 422, 503
)


def parse_metrics(metrics: str) -> list[str]:
    """Comma-separated known metrics (spaces around each allowed), at least two distinct; a
    metric named again is ignored. Exactly what `METRICS_PATTERN` documents."""
    names = [m.strip(" ") for m in metrics.split(",")]
    unknown = [m for m in names if m not in OBJECTIVE_METRICS]
    if unknown:
        raise ApiError(
            422, f"unknown metric {unknown[0]!r}; expected val_loss or a cost metric", "metrics"
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


MetricsQuery = Annotated[
    str,
    Query(
        description="comma-separated, at least two distinct, each minimised",
        json_schema_extra={"pattern": METRICS_PATTERN},
    ),
]


@router.get("/{job_id}/pareto", response_model=ParetoRead, responses=JOB_ERRORS)
def pareto(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    metrics: MetricsQuery,
    variant: Variant | None = None,
) -> ParetoRead:
    return queries.pareto(session, cache, job_id, parse_metrics(metrics), variant)


@router.get("/{job_id}/optimum", response_model=OptimumRead, responses=JOB_ERRORS)
def optimum(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    bootstrap: Annotated[int, Query(ge=0, le=2000)] = 200,
) -> OptimumRead:
    return queries.optimum(session, cache, job_id, bootstrap)


@router.get("/{job_id}/scaling", response_model=ScalingRead, responses=JOB_ERRORS)
def scaling(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    reference: Variant | None = None,
    loss: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> ScalingRead:
    return queries.scaling(session, cache, job_id, reference, loss)


@router.get("/{job_id}/plots/pareto.png", response_class=Response, responses=PNG)
def pareto_plot(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    metrics: MetricsQuery,
    variant: Variant | None = None,
) -> Response:
    png = queries.pareto_png(session, cache, job_id, parse_metrics(metrics), variant)
    return Response(png, media_type="image/png")


@router.get("/{job_id}/plots/optimum.png", response_class=Response, responses=PNG)
def optimum_plot(job_id: str, session: SessionDep, cache: ResultsDep) -> Response:
    return Response(queries.optimum_png(session, cache, job_id), media_type="image/png")
