"""Request and response schemas, named by role (`JobRead`, `JobList`, `TrialRead`, …).

The cost request's `arch`, `workload` and `parallelism` are derived from the cost model's
dataclasses (`ArchConfig`, `Workload`, `Parallelism`): the same fields and defaults, with
types, bounds and choices the OpenAPI document shows; a non-finite number, a null where a
value is required or an integer out of range is a 422 naming the field, before the cost
model sees it. The cost model still checks every combination (`CostInputError`).

The read schemas of jobs, trials, analyses and calibration are defined in
`nas_service.results.reads`, below the HTTP layer (the modules that build the answers import
them from there), and re-exported here."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from cost_model import (
    DTYPE_BYTES,
    MLP_KINDS,
    NORM_KINDS,
    POSITION_KINDS,
    RECOMPUTE_MODES,
    VARIANTS,
    ArchConfig,
    Parallelism,
    Workload,
)
from nas_service.results.reads import AxisSensitivityRead as AxisSensitivityRead
from nas_service.results.reads import BestLrRead as BestLrRead
from nas_service.results.reads import BestObservedRead as BestObservedRead
from nas_service.results.reads import CalibrationGroupRead as CalibrationGroupRead
from nas_service.results.reads import CalibrationPointRead as CalibrationPointRead
from nas_service.results.reads import CalibrationRead as CalibrationRead
from nas_service.results.reads import CalibrationSkipRead as CalibrationSkipRead
from nas_service.results.reads import CompareRead as CompareRead
from nas_service.results.reads import Compute as Compute
from nas_service.results.reads import ConfirmRead as ConfirmRead
from nas_service.results.reads import CrossoverRead as CrossoverRead
from nas_service.results.reads import CrossValidationRead as CrossValidationRead
from nas_service.results.reads import CurveRead as CurveRead
from nas_service.results.reads import DepthPointRead as DepthPointRead
from nas_service.results.reads import FixedViewRead as FixedViewRead
from nas_service.results.reads import JobList as JobList
from nas_service.results.reads import JobRead as JobRead
from nas_service.results.reads import LandscapeJobRead as LandscapeJobRead
from nas_service.results.reads import LandscapeRead as LandscapeRead
from nas_service.results.reads import MemoryComparisonRead as MemoryComparisonRead
from nas_service.results.reads import OptimumFitRead as OptimumFitRead
from nas_service.results.reads import OptimumRead as OptimumRead
from nas_service.results.reads import PairRead as PairRead
from nas_service.results.reads import ParetoRead as ParetoRead
from nas_service.results.reads import Progress as Progress
from nas_service.results.reads import RungProgress as RungProgress
from nas_service.results.reads import RungRead as RungRead
from nas_service.results.reads import Scalar as Scalar
from nas_service.results.reads import ScalingFitRead as ScalingFitRead
from nas_service.results.reads import ScalingRead as ScalingRead
from nas_service.results.reads import SensitivityRead as SensitivityRead
from nas_service.results.reads import SettingRead as SettingRead
from nas_service.results.reads import StepModelRead as StepModelRead
from nas_service.results.reads import StoredOrSpec as StoredOrSpec
from nas_service.results.reads import TrainRunRead as TrainRunRead
from nas_service.results.reads import TrialList as TrialList
from nas_service.results.reads import TrialRead as TrialRead
from nas_service.results.reads import Value as Value
from nas_service.results.reads import VariantSensitivityRead as VariantSensitivityRead
from nas_service.spec.fields import (
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_MEMORY_CAP_BYTES,
    MAX_SEARCH_VIRTUAL,
)
from nas_service.store.tables import TrialStatus

#: A text field's pattern: no NUL character (`routing.check_values` refuses one in any body;
#: saying so in the schema keeps every schema-valid text acceptable).
NO_NUL = r"^[^\x00]*$"

#: The most feasible layouts `POST /v1/cost` lists (`feasible_layouts`).
MAX_FEASIBLE_LISTED = 1000


# -- the cost request --------------------------------------------------------------------------
#: Upper bounds of the cost request's integers: far beyond any model priced, small enough
#: that every formula stays finite.
_INT_MAX: dict[str, int] = {
    "n_layers": 1 << 16,
    "d_model": 1 << 20,
    "n_heads": 1 << 16,
    "n_kv_heads": 1 << 16,
    "vocab_size": 1 << 24,
    "seq_len": 1 << 24,
    "d_ff": 1 << 24,
    "block_size": 1 << 17,
    "mhc_streams": 6,
    "micro_batch": 1 << 20,
    "microbatches": 1 << 20,
    "prefill_tokens": 1 << 24,
    "prefill_chunk": 1 << 24,
    "decode_context": 1 << 24,
    "decode_batch": 1 << 20,
    "tensor": 1 << 16,
    "pipeline": 1 << 16,
    "virtual": 1 << 10,
    "data": 1 << 20,
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "variant": VARIANTS,
    "mlp": MLP_KINDS,
    "norm": NORM_KINDS,
    "positions": POSITION_KINDS,
    "dtype": tuple(DTYPE_BYTES),
    "recompute": RECOMPUTE_MODES,
}


def _field_type(name: str, hint: Any) -> tuple[Any, Any]:
    """The pydantic type and `Field` constraints of one cost-model dataclass field."""
    optional = type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    kw: dict[str, Any] = {}
    if name in _CHOICES:
        kind: Any = Literal[_CHOICES[name]]
    elif base is bool:
        kind = bool
        kw = {"strict": True}
    elif base is int:
        kind = int
        kw = {"ge": 1, "le": _INT_MAX.get(name, 1 << 20), "strict": True}
    elif base is float:
        kind = float
        kw = {"gt": 0, "le": 1e6, "allow_inf_nan": False}
    else:
        kind = base
    return (kind | None if optional else kind), kw


def _model_of(kind: type, name: str) -> type[BaseModel]:
    hints = typing.get_type_hints(kind)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        if f.name not in hints or not f.init:
            continue
        annotation, kw = _field_type(f.name, hints[f.name])
        default = ... if f.default is dataclasses.MISSING else f.default
        fields[f.name] = (annotation, Field(default, **kw))
    model = create_model(
        name,
        __config__=ConfigDict(extra="forbid", strict=True),
        __doc__=f"The fields of `cost_model.{kind.__name__}`.",
        **fields,
    )
    return model  # type: ignore[no-any-return]


ArchIn = _model_of(ArchConfig, "ArchIn")
WorkloadIn = _model_of(Workload, "WorkloadIn")
ParallelismIn = _model_of(Parallelism, "ParallelismIn")


#: `POST /v1/cost` under `layout: fixed` (given, or left out): the layout search's fields
#: stay at their defaults (`api/cost.py` refuses them otherwise, naming the field).
_FIXED: dict[str, Any] = {
    "not": {"required": ["layout"], "properties": {"layout": {"const": "auto"}}}
}
_FIXED_TAKES: dict[str, Any] = {
    "properties": {
        "feasible_layouts": {"const": 0},
        "devices": {"type": "null"},
        "global_batch": {"type": "null"},
        "memory_cap_bytes": {"type": "null"},
        "max_virtual": {"const": 4},
    }
}


class CostRequest(BaseModel):
    """Strict: a number given as a string, a boolean as a number, … is refused (422).

    `layout: fixed` prices the `parallelism` and `workload` given. `layout: auto` searches
    the fastest layout on `devices` devices for a global batch of `global_batch` sequences
    (default 8 per device) within `memory_cap_bytes` per device (default: the hardware's),
    with up to `max_virtual` virtual stages (`cost_model.search_layout`), and lists the
    `feasible_layouts` fastest feasible ones; it takes no `parallelism`, nor the workload's
    `micro_batch`, `microbatches` or `recompute` (it searches them)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"if": _FIXED, "then": _FIXED_TAKES}
    )

    arch: ArchIn  # type: ignore[valid-type]
    workload: WorkloadIn = Field(default_factory=WorkloadIn)  # type: ignore[valid-type]
    parallelism: ParallelismIn = Field(default_factory=ParallelismIn)  # type: ignore[valid-type]
    hardware: str = Field(default="h100", max_length=64)
    layout: Literal["fixed", "auto"] = "fixed"
    devices: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    memory_cap_bytes: float | None = Field(
        default=None, gt=0, le=MAX_MEMORY_CAP_BYTES, allow_inf_nan=False
    )
    max_virtual: int = Field(default=4, ge=1, le=MAX_SEARCH_VIRTUAL)
    feasible_layouts: int = Field(
        default=0,
        ge=0,
        le=MAX_FEASIBLE_LISTED,
        description="layout: auto only: list this many of the fastest feasible layouts",
    )


class CostRead(BaseModel):
    """The architecture priced (every field, defaults filled in) and the cost model's
    report in sections (`CostReport.as_dict`: parameters, FLOPs, memory, communication,
    I/O, times, the named metrics)."""

    arch: dict[str, Scalar]
    cost: dict[str, Value]
    #: With `layout: auto`, the search (`LayoutSearch.as_dict`: the best layout, its step
    #: time, memory and link bytes, how many layouts were searched and fit, the feasible list);
    #: the report in `cost` is priced at the best layout.
    layout: dict[str, Value] | None = None


# -- the dashboard's reads (`api/dashboard_api.py`) -------------------------------------------
class SpecText(BaseModel):
    """A job spec as text, YAML or JSON, pasted or uploaded in the dashboard."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(
        max_length=1 << 20,
        pattern=NO_NUL,
        description="the spec as YAML (or JSON) text (no NUL character: no database stores one)",
    )


class ParsedSpec(BaseModel):
    """The text's mapping, as JSON, to submit to `POST /v1/jobs` (which validates it); or,
    where the text is no YAML mapping JSON can carry, `spec` null and the errors, each
    naming where in the text (`text` for the document itself)."""

    spec: dict[str, Value] | None
    errors: list[dict[str, str]]


class MetricInfo(BaseModel):
    unit: str  # parameters | FLOPs | bytes | seconds | loss
    description: str


class ResidualPartRead(BaseModel):
    """One part of a variant label after the variant (`/S=4`): its tag, the `ArchConfig`
    field it sets, the spec's `space` field listing its values, the variants that have it."""

    tag: str
    field: str
    space_field: str
    variants: list[str]


class ResidualCodecRead(BaseModel):
    """How a variant label is written: the variant, then `separator`, tag, `assign`, value
    for each of its parts (`block_attnres/S=4`)."""

    separator: str
    assign: str
    parts: list[ResidualPartRead]


class CatalogueRead(BaseModel):
    """What the dashboard offers to pick from: every metric a job can record (the measured
    loss and the cost model's `METRICS`) with its unit, the residual variants, the hardware
    presets."""

    metrics: dict[str, MetricInfo]
    variants: list[str]
    hardware: list[str]
    #: per variant, the architecture fields it takes that not every variant does
    variant_fields: dict[str, list[str]]
    residual_codec: ResidualCodecRead


class PointsRead(BaseModel):
    """A job's trials as columns (index i of each list is one trial), for charts of every
    trial: number, state, variant label (`block_attnres/S=4`), shape, d_model/n_layers, and
    the chosen metrics (null where not recorded); `profile` lists each architecture's best
    training setting (its trial and its mean loss over seeds), what the optimum fits."""

    job_id: str
    total: int
    number: list[int]
    state: list[TrialStatus]
    variant: list[str]
    n_layers: list[int | None]
    d_model: list[int | None]
    ratio: list[float | None]
    metrics: dict[str, list[float | None]]
    profile_trials: list[int]
    profile_loss: list[float]
