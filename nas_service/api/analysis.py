"""Pareto fronts over any recorded metrics, the d_model/L optimum, scaling fits, and plots."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from cost_model import VARIANTS
from nas_service import analysis
from nas_service.api.deps import ResultsDep, SessionDep
from nas_service.api.errors import ApiError, responses
from nas_service.api.jobs import JOB_ERRORS, job_results, read_job_row
from nas_service.api.routing import SECURED, ApiRoute
from nas_service.api.schemas import OptimumRead, ParetoRead, ScalingRead
from nas_service.results import optimum_by_variant, pareto_rows, scaling_by_variant
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


def check_variant(variant: str | None) -> None:
    if variant is not None and variant not in VARIANTS:
        raise ApiError(422, f"unknown variant {variant!r}", "variant")


MetricsQuery = Annotated[
    str,
    Query(
        description="comma-separated, at least two distinct, each minimised",
        json_schema_extra={"pattern": METRICS_PATTERN},
    ),
]
Variant = Literal[VARIANTS]  # type: ignore[valid-type]


@router.get("/{job_id}/pareto", response_model=ParetoRead, responses=JOB_ERRORS)
def pareto(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    metrics: MetricsQuery,
    variant: Variant | None = None,
) -> ParetoRead:
    names = parse_metrics(metrics)
    check_variant(variant)
    results = job_results(cache, read_job_row(session, cache, job_id))

    def answer() -> ParetoRead:
        front, candidates = pareto_rows(results, names, variant)
        front.sort(key=lambda r: [r.metrics[m] for m in names])
        return ParetoRead(
            metrics=names,
            variant=variant,
            n_candidates=len(candidates),
            front=[r.as_dict() for r in front],
        )

    read: ParetoRead = results.memoised(("pareto", tuple(names), variant), answer)
    return read


@router.get("/{job_id}/optimum", response_model=OptimumRead, responses=JOB_ERRORS)
def optimum(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    bootstrap: Annotated[int, Query(ge=0, le=2000)] = 200,
) -> OptimumRead:
    results = job_results(cache, read_job_row(session, cache, job_id))
    fits = results.memoised(("optimum", bootstrap), lambda: optimum_by_variant(results, bootstrap))
    return OptimumRead(
        job_id=job_id, fits=[{k: v for k, v in f.items() if not k.startswith("_")} for f in fits]
    )


@router.get("/{job_id}/scaling", response_model=ScalingRead, responses=JOB_ERRORS)
def scaling(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    reference: Variant | None = None,
    loss: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> ScalingRead:
    check_variant(reference)
    out = scaling_by_variant(
        job_results(cache, read_job_row(session, cache, job_id)), reference, loss
    )
    return ScalingRead(job_id=job_id, **out)


def _png(draw) -> Response:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plot.png"
        draw(str(path))
        return Response(path.read_bytes(), media_type="image/png")


@router.get("/{job_id}/plots/pareto.png", response_class=Response, responses=PNG)
def pareto_plot(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    metrics: MetricsQuery,
    variant: Variant | None = None,
) -> Response:
    names = parse_metrics(metrics)[:2]
    check_variant(variant)
    front, candidates = pareto_rows(
        job_results(cache, read_job_row(session, cache, job_id)), names, variant
    )
    if not candidates:
        raise ApiError(409, "no trial has these metrics yet", "metrics")
    index = {id(r): i for i, r in enumerate(candidates)}
    return _png(
        lambda path: analysis.plot_pareto(
            [r.metrics[names[1]] for r in candidates],
            [r.metrics[names[0]] for r in candidates],
            [index[id(r)] for r in front],
            [r.variant for r in candidates],
            names[1],
            names[0],
            path,
        )
    )


@router.get("/{job_id}/plots/optimum.png", response_class=Response, responses=PNG)
def optimum_plot(job_id: str, session: SessionDep, cache: ResultsDep) -> Response:
    fits = optimum_by_variant(job_results(cache, read_job_row(session, cache, job_id)), 100)
    if not fits:
        raise ApiError(409, "no trained trial yet", "job_id")
    several = len({f["budget"] for f in fits}) > 1

    def label(f: dict[str, Any]) -> str:
        return f"{f['variant']} @ {f['budget']:.3g}" if several else str(f["variant"])

    data = {label(f): f["_data"] for f in fits}
    fit_map = {label(f): f["_fit"] for f in fits}
    return _png(lambda path: analysis.plot_optimum(data, fit_map, path))
