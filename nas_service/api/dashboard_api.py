"""The reads the dashboard (`nas_service/dashboard/`) needs beyond the API's own routes.

- `POST /v1/specs/parse`: a spec pasted or uploaded as YAML (or JSON) text, parsed with the
  bounds of spec files (`spec.load_yaml_text`: a size cap, no anchors or aliases, a nesting
  limit, exponent numbers as floats) into the JSON mapping the page then submits to
  `POST /v1/jobs`, so a spec is validated there, exactly as any JSON one. Text that holds no
  mapping JSON can carry answers 200 with `spec` null and the errors naming where (the
  answer of a parse, not a refusal of the request: the request itself was well formed).
- `GET /v1/catalogue`: the metrics (with units), variants and hardware presets to pick from.
- `GET /v1/jobs/{id}/points`: every trial as columns (number, state, variant, shape,
  d_model/n_layers, the chosen metrics) and the profile (each architecture's best setting):
  what a chart of 10,000 trials draws, in one answer of a few numbers per trial.
- `GET /v1/jobs/{id}/table`: a page of trials sorted by any column (number, a metric, the
  shape, the duration) and filtered by state, variant and shape (server-side paging).
- `GET /v1/jobs/{id}/trials/{number}`: one trial, with its learning curve.

Every answer is memoised per state of the job's study (`JobResults.memoised`), as the
API's other reads are, but for the table's pages: its sorted rows are, and a page is cut from
them on each request.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Path, Query, Response

from cost_model import METRICS, VARIANTS
from cost_model.hardware import PRESETS
from cost_model.residuals import VARIANT_FIELDS
from nas_service.api.deps import ResultsDep, SessionDep
from nas_service.api.errors import ApiError, responses
from nas_service.api.jobs import JOB_ERRORS, Offset
from nas_service.api.routing import INT_MAX, SECURED, ApiRoute, BodyRefused, check_values
from nas_service.api.schemas import (
    CatalogueRead,
    MetricInfo,
    ParsedSpec,
    PointsRead,
    ResidualCodecRead,
    SpecText,
    TrialList,
    TrialRead,
)
from nas_service.results import queries
from nas_service.results.rows import TrialRow
from nas_service.search.numbers import finite_or_none
from nas_service.spec import OBJECTIVE_METRICS, SpecError, load_yaml_text
from nas_service.spec.space import residual_codec
from nas_service.store import TrialStatus

router = APIRouter(prefix="/v1", tags=["dashboard"], route_class=ApiRoute, dependencies=SECURED)

#: Table columns a page may be sorted by, besides every metric.
SORT_COLUMNS = ("number", "n_layers", "d_model", "ratio", "duration_s", "state", "variant")
_ONE_METRIC = "(?:" + "|".join(re.escape(m) for m in OBJECTIVE_METRICS) + ")"
#: One or more known metrics, comma-separated (spaces around each allowed).
METRIC_LIST_PATTERN = rf"^ *{_ONE_METRIC} *(?:, *{_ONE_METRIC} *)*$"
SORT_PATTERN = "^(?:" + "|".join(re.escape(c) for c in (*SORT_COLUMNS, *OBJECTIVE_METRICS)) + ")$"
#: A variant as a job names it: the bare variant or with its block size (`block_attnres/S=4`).
VARIANT_PATTERN = r"^[a-z_]+(/[A-Za-z]+=[0-9]+)*$"
#: Shape filters: the ceilings of the spec's own axes are far below these.
ShapeQuery = Annotated[int | None, Query(ge=1, le=1 << 20)]


# -- POST /v1/specs/parse ----------------------------------------------------------------
def _jsonable(value: Any, where: tuple[Any, ...], errors: list[dict[str, str]]) -> Any:
    """YAML's safe types as JSON's: a timestamp as its ISO 8601 text; binary, a set, or a
    key that is not a string (JSON keys are strings) are errors naming where they are."""
    field = ".".join(str(p) for p in where) or "text"
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append({"field": field, "message": f"key {key!r} is not a string"})
                continue
            out[key] = _jsonable(item, (*where, key), errors)
        return out
    if isinstance(value, list):
        return [_jsonable(item, (*where, i), errors) for i, item in enumerate(value)]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    errors.append({"field": field, "message": f"a {type(value).__name__} is not JSON"})
    return None


def parse_spec_text(text: str) -> ParsedSpec:
    """The text's YAML mapping as JSON (not validated: `POST /v1/jobs` does that), or the
    reasons it is none: not YAML, not a mapping, or a value JSON cannot carry (a NaN, an
    integer beyond 64 bits, a NUL character…), each with the field it is at."""
    try:
        data = load_yaml_text(text, "the text", "text")
    except SpecError as exc:
        return ParsedSpec(spec=None, errors=[{"field": f, "message": m} for f, m in exc.errors])
    except yaml.YAMLError as exc:  # raised by the loader's reader before it parses (`\x07`)
        message = f"the text is not valid YAML: {exc}"
        return ParsedSpec(spec=None, errors=[{"field": "text", "message": message}])
    if not isinstance(data, dict):
        kind = "nothing" if data is None else f"a {type(data).__name__}"
        return ParsedSpec(
            spec=None,
            errors=[{"field": "text", "message": f"a spec is a mapping of fields; this is {kind}"}],
        )
    errors: list[dict[str, str]] = []
    spec = _jsonable(data, (), errors)
    if not errors:
        try:
            check_values(spec)
        except BodyRefused as exc:
            errors.append({"field": exc.field, "message": str(exc.detail)})
    return ParsedSpec(spec=None if errors else spec, errors=errors)


#: `tests/api/test_api_docs.py` asks every route but /v1/cost to document a 503; these two
#: read no database (the exemption they would share with /v1/cost is the test's to make).
NO_DATABASE = (401, 503)


@router.post("/specs/parse", response_model=ParsedSpec, responses=responses(*NO_DATABASE, 413, 422))
def parse(body: SpecText) -> ParsedSpec:
    """Parse a job spec's YAML (or JSON) text into the JSON mapping to submit to
    `POST /v1/jobs`; what is not a usable mapping comes back as errors naming the field."""
    return parse_spec_text(body.text)


# -- GET /v1/catalogue -------------------------------------------------------------------
@router.get("/catalogue", response_model=CatalogueRead, responses=responses(*NO_DATABASE))
def catalogue() -> CatalogueRead:
    """The metrics a job can record (the measured `val_loss` and every cost metric, with its
    unit), the residual variants (with the architecture fields only some take, and how a
    variant label such as `block_attnres/S=4` is written) and the hardware presets."""
    metrics = {"val_loss": MetricInfo(unit="loss", description="final validation loss (nats)")}
    metrics["val_bpb"] = MetricInfo(
        unit="bits/byte", description="final validation loss in bits per UTF-8 byte of text"
    )
    metrics |= {
        name: MetricInfo(unit=unit, description=text) for name, (unit, text) in METRICS.items()
    }
    return CatalogueRead(
        metrics=metrics,
        variants=list(VARIANTS),
        hardware=sorted(PRESETS),
        variant_fields={v: list(VARIANT_FIELDS[v]) for v in VARIANTS},
        residual_codec=ResidualCodecRead.model_validate(residual_codec()),
    )


# -- the job's trials --------------------------------------------------------------------
def _shape(row: TrialRow, name: str) -> int | None:
    value = row.arch.get(name)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _ratio(row: TrialRow) -> float | None:
    """d_model / n_layers, the abscissa of the optimum's fit (`results._ratio`)."""
    d_model, n_layers = _shape(row, "d_model"), _shape(row, "n_layers")
    return d_model / n_layers if d_model and n_layers else None


def _metric_names(raw: str | None, objectives: list[str]) -> list[str]:
    if raw is None:
        return list(dict.fromkeys(["val_loss", *objectives]))
    return list(dict.fromkeys(m.strip(" ") for m in raw.split(",")))


@router.get("/jobs/{job_id}/points", response_model=PointsRead, responses=JOB_ERRORS)
def points(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    metrics: Annotated[
        str | None,
        Query(
            description="comma-separated metrics to include (default: val_loss and the "
            "job's objectives)",
            json_schema_extra={"pattern": METRIC_LIST_PATTERN},
        ),
    ] = None,
) -> PointsRead:
    """Every trial of the job (but those lost to a crash) as columns, and its profile: each
    architecture's best training setting (`profiles.profile`), by trial and mean loss."""
    if metrics is not None and not re.match(METRIC_LIST_PATTERN, metrics):
        raise ApiError(422, "give known metrics, comma-separated", "metrics")
    results = queries.job_results(cache, queries.job_row(session, cache, job_id))
    names = _metric_names(metrics, results.objectives)

    def answer() -> PointsRead:
        rows = [r for r in results.rows if not r.lost]
        trained = {  # the architectures a fit can place
            r.arch_key
            for r in results.counted()
            if r.state == TrialStatus.COMPLETE and r.arch and _ratio(r) is not None
        }
        best = [p for p in results.profile() if p.arch_key in trained]
        return PointsRead(
            job_id=job_id,
            total=len(rows),
            number=[r.number for r in rows],
            state=[r.state for r in rows],
            variant=[r.residual for r in rows],
            n_layers=[_shape(r, "n_layers") for r in rows],
            d_model=[_shape(r, "d_model") for r in rows],
            ratio=[_ratio(r) for r in rows],
            metrics={m: [finite_or_none(r.metrics.get(m)) for r in rows] for m in names},
            profile_trials=[p.row.number for p in best],
            profile_loss=[float(p.loss) for p in best],
        )

    return results.memoised(("dashboard-points", tuple(names)), answer)


def _sort_key(column: str) -> Callable[[TrialRow], tuple[Any, ...]]:
    """Rows by `column`, missing values last whichever the direction (see `table`), ties by
    trial number."""

    def value(row: TrialRow) -> Any:
        if column == "number":
            return row.number
        if column in ("n_layers", "d_model"):
            return _shape(row, column)
        if column == "ratio":
            return _ratio(row)
        if column == "duration_s":
            return row.duration_s
        if column == "state":
            return str(row.state)
        if column == "variant":
            return row.residual
        return finite_or_none(row.metrics.get(column))

    return lambda row: (value(row), row.number)


@router.get("/jobs/{job_id}/table", response_model=TrialList, responses=JOB_ERRORS)
def table(
    job_id: str,
    session: SessionDep,
    cache: ResultsDep,
    sort: Annotated[
        str,
        Query(
            description="a column (number, n_layers, d_model, ratio, duration_s, state, "
            "variant) or a metric",
            pattern=SORT_PATTERN,
        ),
    ] = "number",
    descending: bool = False,
    state: TrialStatus | None = None,
    variant: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=100,
            pattern=VARIANT_PATTERN,
            description="a variant (baseline) or a variant label (block_attnres/S=4)",
        ),
    ] = None,
    n_layers: ShapeQuery = None,
    d_model: ShapeQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
) -> Response:
    """A page of the job's trials (but those lost to a crash), filtered by state, variant
    (bare or labelled) and shape, sorted by `sort` (trials without the value last)."""
    results = queries.job_results(cache, queries.job_row(session, cache, job_id))
    key = ("dashboard-table", sort, descending, state, variant, n_layers, d_model)

    def ordered() -> list[TrialRow]:
        rows = [
            r
            for r in results.rows
            if not r.lost
            and (state is None or r.state == state)
            and (variant is None or variant in (r.variant, r.residual))
            and (n_layers is None or _shape(r, "n_layers") == n_layers)
            and (d_model is None or _shape(r, "d_model") == d_model)
        ]
        order = _sort_key(sort)
        known = [r for r in rows if order(r)[0] is not None]
        missing = [r for r in rows if order(r)[0] is None]
        known.sort(key=order, reverse=descending)
        return known + missing

    # the sorted rows once per state of the study (the table's own rows, a list of
    # references); the page is assembled on each request from its rows' encoded reads
    rows = results.memoised(key, ordered)
    page = queries.page_json(rows[offset : offset + limit], len(rows), limit, offset, False)
    return Response(page, media_type="application/json")


@router.get("/jobs/{job_id}/trials/{number}", response_model=TrialRead, responses=JOB_ERRORS)
def trial(
    job_id: str,
    number: Annotated[int, Path(ge=0, le=INT_MAX, description="the trial's number")],
    session: SessionDep,
    cache: ResultsDep,
    curve: bool = True,
) -> TrialRead:
    """One trial of the job, by number, with its learning curve unless `curve=false`."""
    results = queries.job_results(cache, queries.job_row(session, cache, job_id))
    for row in results.rows:
        if row.number == number:
            return TrialRead.model_validate(row.as_dict(curve))
    raise ApiError(404, f"this job has no trial {number}", "number")
