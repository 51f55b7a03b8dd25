"""The job spec's models: the search space, budget, objectives, constraints, training
and cost context (`JobSpec`), every field bounded; `parse_spec` and `SpecError`."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cost_model import (
    METRICS,
    VARIANTS,
    CostInputError,
    Parallelism,
    Workload,
    get_hardware,
)
from cost_model.residuals import BLOCK_SIZED
from workers.contract import Schedule

LOSS = "val_loss"
OBJECTIVE_METRICS: tuple[str, ...] = (LOSS, *METRICS)

#: Ceilings of the fields that size something and have no operator limit in `Settings`.
MAX_SEED = 2**32 - 1  # Optuna's and numpy's seeds are 32-bit
MAX_ASPECT_RATIO = 1e6
MAX_EVALS = 10_000  # validation points per run (n_evals) and batches per point
MAX_VOCAB = 1 << 24  # embedding rows: far above any tokenizer in use
MAX_LAYOUT = 4096  # tensor and pipeline ranks, virtual stages
MAX_MICROBATCHES = 1 << 20
MAX_FF_RATIO = 64.0
MAX_LR = 1e3
MAX_CONSTRAINTS = 64
#: A YAML spec file: at most this many bytes, at most this deep.
MAX_SPEC_BYTES = 1 << 20
MAX_YAML_DEPTH = 64


class SpecError(ValueError):
    """A refused job spec: `errors` is a list of (field, reason), the first also as attributes."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        self.field, self.reason = errors[0]
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (Ray, multiprocessing)
        return (type(self), (self.errors,))


def _check_text(value: str) -> str:
    """Refuse NUL bytes, other control characters (tab and newline included) and lone
    surrogates: PostgreSQL refuses NUL in text, and none of them belongs in a name or path."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            what = "a NUL byte" if ch == "\0" else f"the control character U+{ord(ch):04X}"
            raise ValueError(f"contains {what} at position {i}; only printable text is accepted")
    return value


#: A string from a spec: printable text only.
Text = Annotated[str, AfterValidator(_check_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IntRange(_Strict):
    """low, low + step, …, up to high (inclusive). Counted arithmetically (`count`, `last`):
    only `values()` expands it, and only after `check_job` has bounded it."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.high < self.low:
            raise ValueError(f"inverted range: high {self.high} < low {self.low}")
        return self

    @property
    def count(self) -> int:
        """How many values, without building them."""
        return (self.high - self.low) // self.step + 1

    @property
    def last(self) -> int:
        """The largest value (high, or below it when the step does not land on it)."""
        return self.low + (self.count - 1) * self.step

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


def _axis_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | IntRange) else "choices"


#: Either explicit choices `[2, 4, 8]` or a range `{low: 2, high: 8, step: 2}`.
IntAxis = Annotated[
    Annotated[IntRange, Tag("range")] | Annotated[list[int], Tag("choices")],
    Discriminator(_axis_kind),
]


def axis_values(axis: IntAxis | None) -> list[int]:
    """The values of an axis, expanded: call it on a spec `check_job` accepted (a range is
    bounded there); use `axis_count` and `axis_max` to size an axis."""
    if axis is None:
        return []
    return axis.values() if isinstance(axis, IntRange) else list(axis)


def axis_count(axis: IntAxis | None) -> int:
    """The number of values of an axis (0 for None), without expanding a range."""
    if axis is None:
        return 0
    return axis.count if isinstance(axis, IntRange) else len(axis)


def axis_max(axis: IntAxis | None) -> int | None:
    """The largest value of an axis (None for None), without expanding a range."""
    if axis is None:
        return None
    return axis.last if isinstance(axis, IntRange) else max(axis)


def _check_names(values: list[str], known: Collection[str], noun: str, expected: str) -> list[str]:
    """Distinct names, each one of `known`; the first unknown one is named in the error."""
    _check_choices(values, positive=False)
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"unknown {noun} {unknown[0]!r}; expected {expected}")
    return values


def _check_choices(values: list[Any], positive: bool = True) -> list[Any]:
    if not values:
        raise ValueError("empty: give at least one value")
    if len(set(values)) != len(values):
        raise ValueError("duplicate values")
    if positive and any(v <= 0 for v in values):
        raise ValueError("values must be positive")
    return values


def _one_or_many(value: Any) -> str:
    return "choices" if isinstance(value, list | tuple) else "single"


def _integral_floats(value: Any) -> Any:
    """Whole-valued floats (1e13 from JSON) become ints before int validation, whatever
    their size, so that an over-large count is refused against its limit rather than as a
    parse error; other values are left to pydantic."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


#: A budget: one value, or several (a searched axis).
FloatBudget = Annotated[
    Annotated[float, Tag("single")] | Annotated[list[float], Tag("choices")],
    Discriminator(_one_or_many),
]
IntBudget = Annotated[
    Annotated[int, Tag("single")] | Annotated[list[int], Tag("choices")],
    Discriminator(_one_or_many),
]


class ParamsTarget(_Strict):
    """A fixed parameter count: the width follows from the depth (`cost_model.budget`)."""

    params: float = Field(gt=0)
    tolerance: float = Field(default=0.1, gt=0, le=1)


class ArchDefaults(_Strict):
    """The architecture fields that are not searched."""

    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    positions: Literal["rope", "learned"] = "rope"
    bias: bool = False
    tie_embeddings: bool = True
    ff_ratio: float | None = Field(default=None, gt=0, le=MAX_FF_RATIO)
    mhc_streams: int | None = Field(default=None, ge=2, le=6)


class SearchSpace(_Strict):
    """Depth (Transformer blocks), then exactly one way to set the width: `d_model` choices,
    a `params_target`, or `aspect_ratio` choices (d_model / n_layers, rounded to a multiple
    of the head dimension). Heads: `n_heads` choices, else d_model / `head_dim`."""

    n_layers: IntAxis
    d_model: IntAxis | None = None
    params_target: ParamsTarget | None = None
    aspect_ratio: list[float] | None = None
    n_heads: IntAxis | None = None
    head_dim: int = Field(default=64, ge=2)
    variants: list[Text] = Field(default_factory=lambda: ["baseline"])
    block_sizes: IntAxis | None = None
    arch: ArchDefaults = Field(default_factory=ArchDefaults)

    @field_validator("n_layers", "d_model", "n_heads", "block_sizes")
    @classmethod
    def _axis(cls, value: IntAxis | None) -> IntAxis | None:
        if isinstance(value, list):
            _check_choices(value)
        return value

    @field_validator("aspect_ratio")
    @classmethod
    def _ratios(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return None
        _check_choices(value)
        if any(v > MAX_ASPECT_RATIO for v in value):
            raise ValueError(f"values must be at most {MAX_ASPECT_RATIO:g}")
        return value

    @field_validator("variants")
    @classmethod
    def _variants(cls, value: list[str]) -> list[str]:
        return _check_names(value, VARIANTS, "variant", f"one of {', '.join(VARIANTS)}")

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpace:
        widths = [
            self.d_model is not None,
            self.params_target is not None,
            self.aspect_ratio is not None,
        ]
        if sum(widths) != 1:
            raise ValueError("give exactly one of d_model, params_target and aspect_ratio")
        blocked = ", ".join(BLOCK_SIZED)
        if any(v in BLOCK_SIZED for v in self.variants) and self.block_sizes is None:
            raise ValueError(f"block_sizes: needed when variants include {blocked}")
        if self.block_sizes is not None and not any(v in BLOCK_SIZED for v in self.variants):
            raise ValueError(f"block_sizes: only {blocked} has a block size")
        return self


class Budget(_Strict):
    """Per candidate: training FLOPs (causal count) or training tokens, exactly one. A list
    makes the budget a searched axis (a scaling-law job over several budgets)."""

    flops: FloatBudget | None = None
    tokens: IntBudget | None = None

    @field_validator("flops", "tokens", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse NaN and infinities (also as strings, "NaN" from a JSON file read as YAML)
        and fractional token counts on the budget's own field, every value of a list
        included; whole-valued floats become token counts."""
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, bool):
                raise ValueError(f"must be a number, not {str(v).lower()}")
            number = v
            if isinstance(v, str):
                try:
                    number = float(v)
                except ValueError:
                    continue  # not a number: pydantic says so
            if not isinstance(number, float):
                continue
            if not math.isfinite(number):
                raise ValueError(f"must be a finite number, got {number}")
            if info.field_name == "tokens" and not number.is_integer():
                raise ValueError(f"must be a whole number of tokens, got {number:g}")
        return _integral_floats(value) if info.field_name == "tokens" else value

    @field_validator("flops", "tokens")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        if isinstance(value, list):
            _check_choices(value)
        elif value is not None and not value > 0:
            raise ValueError("must be greater than 0")
        return value

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if (self.flops is None) == (self.tokens is None):
            raise ValueError("give exactly one of flops and tokens")
        return self

    @property
    def kind(self) -> str:
        return "flops" if self.flops is not None else "tokens"

    def values(self) -> list[float]:
        return [float(v) for v in self.raw_values()]

    def train_fields(self, value: float) -> dict[str, Any]:
        """One of the budgets as `TrainSpec`'s fields (`budget_flops` or `budget_tokens`)."""
        if self.kind == "flops":
            return {"budget_flops": float(value)}
        return {"budget_tokens": int(value)}

    def raw_values(self) -> list[int | float]:
        """The budgets as given (tokens stay ints, however large)."""
        raw = self.flops if self.flops is not None else self.tokens
        if isinstance(raw, list):
            return list(raw)
        return [] if raw is None else [raw]


class Constraint(_Strict):
    """A cap on a cost-model metric; a candidate over it is never trained."""

    metric: Text
    max: float = Field(gt=0)

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of {', '.join(METRICS)}")
        return value


class Training(_Strict):
    """How every candidate is trained: `TrainSpec`'s fields of the same names (the service
    builds it from `model_dump`), except `ARCH_FIELDS`, which go to the architecture
    (`base_arch`). seq_len, batch_size and threads are bounded by the operator's limits
    (`check_job`); the corpus is a name registered by the operator or a path inside the
    data folder (`resolve_corpus`)."""

    ARCH_FIELDS: ClassVar[frozenset[str]] = frozenset({"vocab_size", "seq_len"})

    corpus: Text | None = Field(default=None, min_length=1, max_length=4096)  # None: built-in
    vocab_size: int = Field(default=256, ge=2, le=MAX_VOCAB)
    seq_len: int = Field(default=128, ge=2)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0, le=MAX_LR)
    schedule: Schedule = "cosine"
    warmup_frac: float = Field(default=0.05, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0, le=MAX_LR)
    n_evals: int = Field(default=8, ge=1, le=MAX_EVALS)
    eval_batches: int = Field(default=8, ge=1, le=MAX_EVALS)
    threads: int | None = Field(default=None, ge=1)


class CostContext(_Strict):
    """The workload, layout and hardware the cost metrics are computed for."""

    hardware: Text = Field(default="h100", max_length=64)
    micro_batch: int = Field(default=8, ge=1)
    seq_len: int | None = Field(default=None, ge=1)  # None: the training seq_len
    microbatches: int = Field(default=1, ge=1, le=MAX_MICROBATCHES)
    recompute: Literal["none", "selective", "full"] = "none"
    tensor: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    pipeline: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    virtual: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    decode_context: int | None = Field(default=None, ge=1)

    @field_validator("hardware")
    @classmethod
    def _preset(cls, value: str) -> str:
        try:
            get_hardware(value)
        except CostInputError as exc:
            raise ValueError(exc.reason) from None
        return value.lower()

    def workload(self, training: Training) -> Workload:
        return Workload(
            micro_batch=self.micro_batch,
            seq_len=self.seq_len or training.seq_len,
            microbatches=self.microbatches,
            recompute=self.recompute,
            decode_context=self.decode_context,
        )

    def parallelism(self) -> Parallelism:
        try:
            return Parallelism(tensor=self.tensor, pipeline=self.pipeline, virtual=self.virtual)
        except CostInputError as exc:
            raise ValueError(str(exc)) from None


class JobSpec(_Strict):
    name: Text = Field(min_length=1, max_length=200)
    space: SearchSpace
    budget: Budget
    objectives: list[Text] = Field(default_factory=lambda: [LOSS])
    constraints: list[Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    sampler: Literal["tpe", "nsga2", "random", "grid"] = "tpe"
    pruner: Literal["auto", "none", "median", "pareto"] = "auto"
    n_trials: int = Field(ge=1)  # ≤ max_trials (check_job)
    max_concurrent: int = Field(default=2, ge=1)  # ≤ max_concurrent_trials (check_job)
    seeds: int = Field(default=1, ge=1)  # ≤ max_seeds (check_job)
    sampler_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    training: Training = Field(default_factory=Training)
    cost: CostContext = Field(default_factory=CostContext)
    cluster: Text = Field(default="local", min_length=1, max_length=100)

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, value: list[str]) -> list[str]:
        expected = f"val_loss or one of {', '.join(METRICS)}"
        return _check_names(value, OBJECTIVE_METRICS, "metric", expected)

    @model_validator(mode="after")
    def _layout(self) -> JobSpec:
        self.cost.parallelism()
        if self.pruner == "median" and len(self.objectives) > 1:
            raise ValueError("pruner: median needs a single objective; use pareto or auto")
        return self

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def parse_spec(data: Any) -> JobSpec:
    """A `JobSpec` from plain data, or `SpecError` listing every (field, reason)."""
    try:
        return JobSpec.model_validate(data)
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
