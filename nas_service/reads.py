"""The service's read schemas: what the job, trial, analysis, landscape and calibration reads
answer with (`JobRead`, `TrialRead`, `ParetoRead`, `CalibrationRead`, …), named by role.

They live below the HTTP layer, so that the modules that build the answers (`queries`,
`calibration`, `landscape`, `simulated`) never import `nas_service.api`; `api/schemas.py`
re-exports every one of them, so the API and its OpenAPI document name the same classes."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field, field_validator
from typing_extensions import TypeAliasType

from nas_service.db.models import JobStatus, TrialStatus
from nas_service.spec import JobSpec

#: A parameter or an architecture field: a number, a string, a flag or nothing.
Scalar = int | float | str | bool | None
#: A value of a nested report (the cost model's sections): scalars, lists and maps of them.
Value = TypeAliasType("Value", "Scalar | list[Value] | dict[str, Value]")


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


class TrainRunRead(BaseModel):
    """One seed's training run as a trial keeps it (`search.train_summary`; the curve is
    kept apart). A field missing from an older record is null."""

    status: str | None = None  # completed | stopped | diverged
    reason: str | None = None
    final_val_loss: float | None = None  # null when not finite
    best_val_loss: float | None = None
    steps: int | None = None
    tokens_seen: int | None = None
    flops_spent: float | None = None
    flops_budget: float | None = None
    wall_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None  # cuda_max_allocated | cpu_peak_rss
    device: str | None = None
    corpus: dict[str, Scalar] | None = None  # the corpus's identity (name, checksum, sizes)
    seed: int | None = None  # the run's seed: seed k of every trial sees the same batches
    setting: dict[str, float] | None = None  # lr, depth_lr_mult, warmup_frac, weight_decay
    rung: int | None = None  # multi-fidelity: the rung this run trained (0-based)
    curve: list[list[float | None]] | None = None  # [step, tokens, flops, val_loss] rows


class RungRead(BaseModel):
    """A rung a trial trained (multi-fidelity): its share of the budget, its loss there (the
    best setting's mean over seeds, after the decay branch of a WSD rung), its objective
    vector, the main line's steps and tokens, and whether it went on to the next rung."""

    rung: int
    fraction: float
    loss: float | None = None
    values: list[float | None] = Field(default_factory=list)
    steps: int | None = None
    tokens: int | None = None
    given_up: list[int] = Field(default_factory=list)  # settings that diverged there
    promoted: bool = False


class SettingRead(BaseModel):
    """One training setting a trial was trained at: its final validation loss per seed
    (null where not finite or diverged) and their mean (null when any run diverged)."""

    setting: dict[str, float]
    losses: list[float | None]
    mean: float | None


class TrialRead(BaseModel):
    """One Optuna trial of a job: its parameters, architecture, metrics and outcome."""

    number: int
    state: TrialStatus
    outcome: str  # a `TrialOutcome`, or "" for a trial finished outside the runner
    reason: str
    variant: str
    params: dict[str, Scalar]
    arch: dict[str, Scalar]  # the `ArchConfig`'s fields; empty when none was built
    metrics: dict[str, float | None]
    values: list[float | None] | None
    train: list[TrainRunRead]  # every run (setting × seed), in the order run
    duration_s: float | None
    budget: float | None
    curve: list[list[float | None]] | None = None
    #: the chosen training setting (a per-shape grid: the best by mean loss over seeds)
    setting: dict[str, float] = Field(default_factory=dict)
    #: every setting tried, with its per-seed losses
    settings: list[SettingRead] = Field(default_factory=list)
    #: the chosen setting's final validation loss per seed (index = seed)
    seeds: list[float | None] = Field(default_factory=list)
    #: multi-fidelity: every rung trained, and the rung it waits at (null: training or done)
    rungs: list[RungRead] = Field(default_factory=list)
    waiting: int | None = None


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
    seeds: list[int]
    differences: list[float]  # variant − reference, per paired seed (negative: better)
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str  # better | worse | no_difference | undetermined
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


class LandscapeJobRead(BaseModel):
    id: str
    name: str
    status: JobStatus
    study_name: str
    objectives: list[str]
    spec: JobSpec


class LandscapeRead(BaseModel):
    """A job recorded as a landscape (`nas_service.landscape`): its spec and every trial with
    its parameters, architecture, costs, settings and per-seed runs (tokens, FLOPs, wall
    time), and its evaluation curve; the corpus the runs read. What a simulated run of the
    same search replays."""

    format: Literal["depthscope-landscape"]
    version: int
    job: LandscapeJobRead
    corpus: dict[str, Scalar] | None  # the identity every run reported (name, checksum, sizes)
    trials: list[TrialRead]


# -- calibration of the roofline (nas_service.calibration) ----------------------------------


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
    the roofline's terms and its cross-validated error (`nas_service.calibration`)."""

    job_id: str
    cluster: str
    scope: str  # job | cluster
    min_trials: int
    ready: bool  # some device kind is calibrated
    message: str
    groups: list[CalibrationGroupRead]
    skipped: list[CalibrationSkipRead]
