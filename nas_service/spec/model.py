"""The job spec as one model (`JobSpec`): its sections (`search_space`, `budget`,
`training`, `cost`, each in its own module), its objectives and constraints, and the checks
that join sections; `parse_spec` reads plain data into it or raises `SpecError`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cost_model import (
    LAYOUT_METRICS,
    METRICS,
)
from cost_model.residuals import DEPTH_MIXED
from nas_service.settings import LOCAL_CLUSTER, MAX_CLUSTER_NAME
from nas_service.spec.budget import Budget, Fidelity
from nas_service.spec.cost import CostContext
from nas_service.spec.fields import (
    MAX_CONSTRAINTS,
    MAX_SEED,
    SpecError,
    Text,
    _check_names,
    _refuse,
    _Strict,
)
from nas_service.spec.search_space import SearchSpace
from nas_service.spec.training import Confirm, FloatRange, Training, Tune

LOSS = "val_loss"
#: the validation loss in bits per UTF-8 byte of the validation text: comparable across
#: tokenizers (text corpora only)
BPB = "val_bpb"
#: The cost metrics a constraint may cap: the report's, and with `cost.layout: auto` the
#: best layout's (`cost_model.LAYOUT_METRICS`).
#: The calibrated step time (`cost.calibration`): the roofline's terms with the efficiency
#: factors fitted on measured trials (`nas_service.results.calibration`).
CALIBRATED = "calibrated_step_time_s"
COST_METRICS: tuple[str, ...] = (*METRICS, *LAYOUT_METRICS, CALIBRATED)
OBJECTIVE_METRICS: tuple[str, ...] = (LOSS, BPB, *COST_METRICS)


class Constraint(_Strict):
    """A cap on a cost-model metric; a candidate over it is never trained."""

    metric: Text
    max: float = Field(gt=0)

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in COST_METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of {', '.join(COST_METRICS)}")
        return value


class Stop(_Strict):
    """End the job once its question is answered, before `n_trials` (then a cap)."""

    optimum_interval: float = Field(
        gt=0,
        le=10,
        description="stop once every variant's loss-optimal d_model/L_b lies inside the "
        "explored shapes with a 90% interval at most this wide in ln(d_model/L_b) (0.2: the "
        "upper end within 22% of the lower)",
    )


class JobSpec(_Strict):
    name: Text = Field(min_length=1, max_length=200)
    space: SearchSpace
    budget: Budget
    objectives: list[Text] = Field(default_factory=lambda: [LOSS])
    constraints: list[Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    # optimum: the grid's shapes in the order that locates each variant's loss-optimal
    # d_model/L_b soonest (`nas_service.search.placement`)
    sampler: Literal["tpe", "nsga2", "random", "grid", "optimum"] = "tpe"
    # auto: one objective, the median rule at equal fractions of each candidate's budget: from
    # a third of it on, more than 1% above the median of at least 5 completed candidates of
    # the same budget (`nas_service.search.pruning`); several objectives, `cannot_reach_front`.
    # median: Optuna's median rule at raw optimizer steps (right only when every candidate
    # trains the same number of steps).
    # pareto: `cannot_reach_front` (with one objective, no pruning). none: every candidate
    # trains its whole budget. A `tune` grid is never pruned; with `fidelity` the rungs decide
    # (auto or none only).
    pruner: Literal["auto", "none", "median", "pareto"] = "auto"
    n_trials: int = Field(ge=1)  # ≤ max_trials (check_job)
    max_concurrent: int = Field(default=2, ge=1)  # ≤ max_concurrent_trials (check_job)
    seeds: int = Field(default=1, ge=1)  # ≤ max_seeds (check_job)
    sampler_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    training: Training = Field(default_factory=Training)
    tune: Tune | None = None
    confirm: Confirm | None = None  # None: each trial is scored on the seeds that chose it
    cost: CostContext = Field(default_factory=CostContext)
    cluster: Text = Field(default=LOCAL_CLUSTER, min_length=1, max_length=MAX_CLUSTER_NAME)
    fidelity: Fidelity | None = None  # None: every candidate trains on its full budget
    stop: Stop | None = None  # None: the job runs its n_trials

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, value: list[str]) -> list[str]:
        expected = f"val_loss, val_bpb or one of {', '.join(COST_METRICS)}"
        return _check_names(value, OBJECTIVE_METRICS, "metric", expected)

    @model_validator(mode="after")
    def _layout(self) -> JobSpec:
        self.cost.parallelism()
        if self.cost.layout != "auto":
            wrong: list[tuple[tuple[str | int, ...], str]] = [
                (("objectives",), f"{m} needs cost.layout: auto")
                for m in self.objectives
                if m in LAYOUT_METRICS
            ]
            wrong += [
                (("constraints", i, "metric"), f"{c.metric} needs cost.layout: auto")
                for i, c in enumerate(self.constraints)
                if c.metric in LAYOUT_METRICS
            ]
            if wrong:
                _refuse(wrong)
        if self.pruner == "median" and len(self.objectives) > 1:
            raise ValueError("pruner: median needs a single objective; use pareto or auto")
        return self

    @model_validator(mode="after")
    def _positions(self) -> JobSpec:
        """Learned positions hold `training.seq_len` of them (the architecture's table): a
        cost workload over a longer sequence or decode context could price no candidate."""
        if self.space.arch.positions != "learned":
            return self
        limit = self.training.seq_len
        errors: list[tuple[tuple[str | int, ...], str]] = [
            (
                ("cost", name),
                f"{value} tokens: learned positions cover only training.seq_len = {limit} "
                f"tokens; use positions: rope, or at most {limit}",
            )
            for name in ("seq_len", "decode_context")
            if (value := getattr(self.cost, name)) is not None and value > limit
        ]
        if errors:
            _refuse(errors)
        return self

    @model_validator(mode="after")
    def _training_axes(self) -> JobSpec:
        """A training axis is searched one way (jointly in `training`, or per shape in
        `tune`); the grid sampler needs choices; `depth_lr_mult` only with a variant that has
        depth-mixing parameters (`cost_model.residuals.DEPTH_MIXED`)."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        joint = self.training.searched()
        tuned = self.tune.axes() if self.tune is not None else {}
        for name in tuned:
            if name in joint:
                errors.append(
                    (
                        ("tune", name),
                        f"also searched jointly in training.{name}; search {name} one way: "
                        f"per shape (tune.{name}) or jointly (training.{name})",
                    )
                )
        if self.sampler in ("grid", "optimum"):
            for name, value in joint.items():
                if isinstance(value, FloatRange):
                    errors.append(
                        (
                            ("training", name),
                            f"the {self.sampler} sampler needs choices, not a range",
                        )
                    )
        if not any(v in DEPTH_MIXED for v in self.space.variants):
            mult = self.training.depth_lr_mult
            where = None
            if "depth_lr_mult" in tuned:
                where = ("tune", "depth_lr_mult")
            elif isinstance(mult, list | FloatRange) or mult != 1:
                where = ("training", "depth_lr_mult")
            if where is not None:
                variants = ", ".join(self.space.variants)
                errors.append(
                    (where, f"none of the variants ({variants}) has depth-mixing parameters")
                )
        if errors:
            _refuse(errors)
        return self

    @model_validator(mode="after")
    def _confirmed(self) -> JobSpec:
        """Confirmation re-measures a setting chosen from a `tune` grid: without a grid of
        several settings nothing is chosen, and more seeds are `seeds`."""
        if self.confirm is None:
            return self
        if self.tune is None:
            _refuse(
                [
                    (
                        ("confirm",),
                        "confirmation needs a tune grid to choose each trial's setting from; "
                        "without one, raise seeds instead",
                    )
                ]
            )
        elif self.tune.size() < 2:
            _refuse(
                [
                    (
                        ("confirm",),
                        "tune lists a single setting, so nothing is chosen to confirm; list "
                        "several values, or raise seeds instead",
                    )
                ]
            )
        return self

    @model_validator(mode="after")
    def _stopped(self) -> JobSpec:
        """The optimum is fitted to the validation loss of trials trained to their end."""
        if self.sampler == "optimum" and LOSS not in self.objectives:
            _refuse(
                [
                    (
                        ("sampler",),
                        f"optimum places shapes by the fit of {LOSS}, which is not among the "
                        "objectives",
                    )
                ]
            )
        if self.stop is None:
            return self
        errors: list[tuple[tuple[str | int, ...], str]] = []
        if LOSS not in self.objectives:
            errors.append(
                (
                    ("stop", "optimum_interval"),
                    f"the optimum is fitted to {LOSS}, which is not among the objectives",
                )
            )
        if self.fidelity is not None:
            errors.append(
                (
                    ("stop", "optimum_interval"),
                    "not with fidelity: a trial that stops at a rung has no full-budget loss to "
                    "fit; drop one of the two",
                )
            )
        if errors:
            _refuse(errors)
        return self

    @model_validator(mode="after")
    def _fidelity(self) -> JobSpec:
        """A fidelity section decides itself which candidates go on (no other pruner), and
        continuing from a checkpoint needs the WSD schedule, every non-final rung in its
        stable phase."""
        fidelity = self.fidelity
        if fidelity is None:
            return self
        errors: list[tuple[tuple[str | int, ...], str]] = []
        if self.pruner not in ("auto", "none"):
            errors.append(
                (
                    ("pruner",),
                    f"{self.pruner} does not combine with fidelity: the rungs decide which "
                    "candidates go on; use auto or none",
                )
            )
        if fidelity.reuse == "checkpoint":
            if self.training.schedule != "wsd":
                errors.append(
                    (
                        ("fidelity", "reuse"),
                        "continuing from a checkpoint is exact only under the WSD schedule: "
                        "set training.schedule: wsd, or reuse: retrain (each promotion then "
                        "retrains from scratch)",
                    )
                )
            else:
                stable = 1 - self.training.decay_frac
                late = [(i, r) for i, r in enumerate(fidelity.rungs[:-1]) if r > stable]
                if late:
                    i, r = late[0]
                    errors.append(
                        (
                            ("fidelity", "rungs"),
                            f"rung {i} ({r:g}) lies in the decay phase (after 1 − decay_frac = "
                            f"{stable:g}): a checkpoint must lie in the stable phase; lower the "
                            "rung, lower training.decay_frac, or use reuse: retrain",
                        )
                    )
        if errors:
            _refuse(errors)
        return self

    @property
    def tune_size(self) -> int:
        """The settings each architecture is trained at: the product of the `tune` lists'
        lengths (1 without `tune`)."""
        return self.tune.size() if self.tune is not None else 1

    @property
    def confirm_seeds(self) -> int:
        """The fresh seeds each trial's chosen setting is confirmed on (0 without `confirm`)."""
        return self.confirm.seeds if self.confirm is not None else 0

    @property
    def trial_runs(self) -> int:
        """Training runs of one trial (at most: a variant without depth-mixing parameters
        trains one `depth_lr_mult`): seeds × `tune_size`, then its confirmation seeds."""
        return self.seeds * self.tune_size + self.confirm_seeds

    @property
    def runs(self) -> int:
        """Training runs of the whole job: n_trials × `trial_runs`."""
        return self.n_trials * self.trial_runs

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def parse_spec(data: Any, context: dict[str, Any] | None = None) -> JobSpec:
    """A `JobSpec` from plain data, or `SpecError` listing every (field, reason). `context`:
    the validation's (`spec.stored.STORED` for a spec read back from a job row)."""
    try:
        return JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(_errors(exc)) from None


_UNION_TAGS = frozenset({"range", "choices", "single"})


def _printable(text: str) -> str:
    """`text` with non-printable characters escaped (a field name may be a stranger's key)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(_printable(str(p)) for p in err["loc"] if p not in _UNION_TAGS)
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append((loc or "spec", msg))
    return out
