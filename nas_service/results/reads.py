"""The service's read schemas: what the job, trial, analysis, landscape and calibration reads
answer with (`JobRead`, `TrialRead`, `ParetoRead`, `CalibrationRead`, …), named by role.

They live below the HTTP layer, so that the modules that build the answers (`queries`,
`calibration`, `landscape`, `simulated`) never import `nas_service.api`; `api/schemas.py`
re-exports every one of them, so the API and its OpenAPI document name the same classes."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field, field_validator

from nas_service.spec import JobSpec
from nas_service.store.records import ConfirmRead as ConfirmRead
from nas_service.store.records import LandscapeJobRead as LandscapeJobRead
from nas_service.store.records import LandscapeRead as LandscapeRead
from nas_service.store.records import RungRead as RungRead
from nas_service.store.records import Scalar as Scalar
from nas_service.store.records import SettingRead as SettingRead
from nas_service.store.records import TrainRunRead as TrainRunRead
from nas_service.store.records import TrialRead as TrialRead
from nas_service.store.records import Value as Value
from nas_service.store.tables import JobStatus

#: A job's spec (`JobSpec`), or the mapping stored for a job whose spec this version no longer
#: reads (`spec.read_stored`). A `JobSpec` instance is taken as it is (never validated again);
#: a valid spec is also a mapping, so the document says `anyOf`.
StoredOrSpec = JobSpec | dict[str, Value]


class RungProgress(BaseModel):
    rung: int
    fraction: float
    reached: int  # trials with a result at this rung
    training: int  # trials training this rung now
    waiting: int  # trials waiting here for promotion
    promoted: int  # trials that went on from here


class Progress(BaseModel):
    counted: int
    completed: int
    running: int
    pruned: int
    infeasible: int
    failed: int
    diverged: int
    #: training runs (settings × seeds of each trial): finished so far, and of the whole job;
    #: a trial's runs count as they finish, so a job with `seeds: 3` moves after its first
    runs_done: int = 0
    runs_total: int = 0
    #: multi-fidelity: per rung, trials that reached it, train it now, wait there, went on
    rungs: list[RungProgress] = Field(default_factory=list)


class Compute(BaseModel):
    kind: str  # flops | tokens
    spent: float
    budget: float
    fraction: float


class JobRead(BaseModel):
    id: str
    name: str
    status: JobStatus
    n_trials: int
    study_name: str
    objectives: list[str]
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    error: str | None
    progress: Progress
    compute: Compute
    eta_s: float | None
    #: the spec as submitted; a stored spec this version no longer reads: the row as stored
    #: (non-finite numbers as "NaN", "Infinity", "-Infinity"), and `spec_error` says why
    spec: StoredOrSpec
    spec_error: str | None = None

    @field_validator("created_at", "started_at", "finished_at")
    @classmethod
    def _utc(cls, value: dt.datetime | None) -> dt.datetime | None:
        """The service stores UTC; SQLite gives it back without the zone (RFC 3339 needs it)."""
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value


class JobList(BaseModel):
    items: list[JobRead]
    total: int
    limit: int
    offset: int


class TrialList(BaseModel):
    items: list[TrialRead]
    total: int
    limit: int
    offset: int


class ParetoRead(BaseModel):
    metrics: list[str]
    variant: str | None
    n_candidates: int
    front: list[TrialRead]


class BestObservedRead(BaseModel):
    """The trained trial of lowest loss among those fitted."""

    trial: int
    val_loss: float
    d_model: int
    n_layers: int
    ratio: float


class FixedViewRead(BaseModel):
    """The optimum fitted at one training setting shared by every shape."""

    setting: dict[str, float]
    optimum_ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str


class OptimumFitRead(BaseModel):
    """The fitted d_model/L_b optimum of one variant (at one budget): loss against
    x = ln(d_model/L_b) fitted by a quadratic, its vertex and an interval from draws of the
    fit's sampling distribution."""

    variant: str
    n_trials: int
    n_shapes: int
    verdict: str  # ok | at_edge | no_minimum | too_few_shapes
    optimum_ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    fitted_loss: float | None = None
    coefficients: list[float] = Field(default_factory=list)  # a, b, c of a·x² + b·x + c
    explored: tuple[float, float] | None = None  # the ratio range of the data
    best_observed: BestObservedRead | None = None
    message: str = ""
    budget: float | None = None
    #: "profile": one point per architecture, its best training setting; "raw": every trial
    view: str = "profile"
    #: the same fit with one training setting shared by every shape (the best single one),
    #: where the job tried several; `moved` says whether the optimum moves between the two
    fixed: FixedViewRead | None = None
    moved: bool | None = None
    move_message: str = ""


class OptimumRead(BaseModel):
    job_id: str
    profile: bool
    fits: list[OptimumFitRead]


class ScalingFitRead(BaseModel):
    """ℒ = A·C^−α of one variant, from its best loss at each budget."""

    variant: str
    A: float
    alpha: float
    points: list[tuple[float, float]]  # (compute, loss)
    residuals: list[float]  # of ln ℒ


class ScalingRead(BaseModel):
    job_id: str
    fits: dict[str, ScalingFitRead]
    problems: dict[str, str]
    reference: str | None = None
    loss: float | None = None
    multipliers: dict[str, float | None] | None = None


class PairRead(BaseModel):
    """One matched shape (same n_layers, d_model, heads, budget): a variant against the
    reference, each at its best training setting, seed by seed."""

    variant: str
    n_layers: int
    sublayers: int
    d_model: int
    n_heads: int
    budget: float | None
    seeds: list[int]  # the paired seeds' numbers
    differences: list[float]  # variant − reference, per paired seed (negative: better)
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str  # better | worse | no_difference | undetermined
    #: confirmation: held-out seeds (each setting chosen on others); selection: the seeds
    #: that chose each setting
    scored_on: str
    #: the settings each side (variant, reference) chose its setting from
    settings_chosen_from: list[int]
    trial: int
    reference_trial: int
    setting: dict[str, float]
    reference_setting: dict[str, float]


class DepthPointRead(BaseModel):
    n_layers: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str


class CrossoverRead(BaseModel):
    """The paired difference of one variant against depth, and the smallest depth from which
    it is reliably better at every depth explored (null: none found)."""

    variant: str
    crossover_depth: int | None
    crossover_sublayers: int | None
    by_depth: list[DepthPointRead]
    message: str


class CompareRead(BaseModel):
    job_id: str
    reference: str
    level: float
    method: str  # how the interval is computed
    #: what the pairs are scored on: confirmation | selection | mixed (null: no pair)
    scored_on: str | None
    #: set when verdicts are scored on the seeds that chose among several settings (biased
    #: toward the side with more settings)
    warning: str | None
    pairs: list[PairRead]
    crossover: list[CrossoverRead]
    unmatched: list[dict[str, Scalar]]  # shapes of a variant the reference lacks (or the reverse)


class CurveRead(BaseModel):
    """Loss against one training axis for one shape (best over the other axes)."""

    n_layers: int
    d_model: int
    n_heads: int
    budget: float | None
    points: list[tuple[float, float | None]]  # (value, loss)
    best: float | None
    at_edge: str | None  # low | high: the best is the smallest / largest value tried


class AxisSensitivityRead(BaseModel):
    axis: str
    values: list[float]
    curves: list[CurveRead]


class BestLrRead(BaseModel):
    n_layers: int
    d_model: int
    n_heads: int
    budget: float | None
    best_lr: float


class VariantSensitivityRead(BaseModel):
    variant: str
    axes: list[AxisSensitivityRead]
    best_lr: list[BestLrRead]
    best_lr_fit: dict[str, Scalar] | None  # ln lr* = c + a ln d_model + b ln n_layers
    flags: list[str]  # e.g. "widen lr: …"


class SensitivityRead(BaseModel):
    job_id: str
    variants: list[VariantSensitivityRead]


# -- calibration of the roofline (nas_service.results.calibration) ----------------------


class StepModelRead(BaseModel):
    """t = compute_factor·compute_s + memory_factor·memory_s + overhead_s (seconds); the
    efficiencies are the reciprocals of the factors (null where a factor is 0)."""

    compute_factor: float
    memory_factor: float
    overhead_s: float
    compute_efficiency: float | None  # achieved fraction of peak FLOP/s
    bandwidth_efficiency: float | None  # achieved fraction of memory bandwidth
    rows: int


class CrossValidationRead(BaseModel):
    """Relative errors |pred − meas| / meas out of fold, calibrated and raw roofline."""

    folds: int
    median_error: float
    p90_error: float
    roofline_median_error: float
    roofline_p90_error: float


class MemoryComparisonRead(BaseModel):
    """Median of measured / analytic memory over the trials of one memory kind: in all, the
    activations (saved tensors) and the state (weights, gradients, optimizer)."""

    memory_kind: str
    trials: int
    median_ratio: float | None
    median_activation_ratio: float | None
    median_state_ratio: float | None


class CalibrationPointRead(BaseModel):
    """One trial on one device kind: its measured step (median over runs) and the roofline
    of that step, in seconds, with the fitted model's predictions; memory in bytes."""

    job_id: str
    trial: int
    variant: str
    runs: int
    measured_s: float
    roofline_s: float
    compute_s: float
    memory_s: float
    calibrated_s: float | None  # calibrated_step_time_s: the fit applied (in sample)
    cv_predicted_s: float | None  # the model fitted without this trial's fold
    memory_kind: str | None
    peak_memory_bytes: int | None
    analytic_memory_bytes: float
    saved_tensor_bytes: int | None
    analytic_activation_bytes: float
    state_bytes: int | None
    analytic_state_bytes: float


class CalibrationGroupRead(BaseModel):
    """A device kind's calibration: ready once it has `min_trials` measured trials (else
    `needed` more), the hardware preset and peaks its roofline used."""

    device_kind: str
    hardware: str
    peak_flops: float  # FLOP/s in `dtype`
    memory_bandwidth: float  # bytes/s
    dtype: str
    ready: bool
    trials: int
    needed: int
    model: StepModelRead | None
    cross_validation: CrossValidationRead | None
    memory: list[MemoryComparisonRead]
    points: list[CalibrationPointRead]


class CalibrationSkipRead(BaseModel):
    job_id: str
    trial: int
    reason: str


class CalibrationRead(BaseModel):
    """`GET /v1/jobs/{id}/calibration`: per device kind, the fit of measured step times to
    the roofline's terms and its cross-validated error (`nas_service.results.calibration`)."""

    job_id: str
    cluster: str
    scope: str  # job | cluster
    min_trials: int
    ready: bool  # some device kind is calibrated
    message: str
    groups: list[CalibrationGroupRead]
    skipped: list[CalibrationSkipRead]
