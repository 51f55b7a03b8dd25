"""The job spec's models: the search space, budget, objectives, constraints, training
and cost context (`JobSpec`), every field bounded; `parse_spec` and `SpecError`."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
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
from pydantic_core import InitErrorDetails, PydanticCustomError

from cost_model import (
    LAYOUT_METRICS,
    METRICS,
    VARIANTS,
    CostInputError,
    Hardware,
    LayoutSpace,
    Parallelism,
    Workload,
    get_hardware,
)
from cost_model.hardware import MAX_DEVICES_PER_NODE
from cost_model.residuals import BLOCK_SIZED, DEPTH_MIXED
from workers.contract import Schedule
from workers.tokenizer import MAX_BPE_VOCAB, MIN_BPE_VOCAB

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

#: Ceilings of the fields that size something and have no operator limit in `Settings`.
MAX_SEED = 2**32 - 1  # Optuna's and numpy's seeds are 32-bit
MAX_ASPECT_RATIO = 1e6
MAX_EVALS = 10_000  # validation points per run (n_evals) and batches per point
MAX_VOCAB = 1 << 24  # embedding rows: far above any tokenizer in use
MAX_LAYOUT = 4096  # tensor and pipeline ranks, virtual stages
MAX_MICROBATCHES = 1 << 20
#: The layout search of `cost.layout: auto`: at most this many devices, this global batch
#: (sequences), this many virtual stages per rank, and this many layouts per candidate (each
#: candidate's search prices every one: about a second at this size).
MAX_DEVICES = 1 << 16
MAX_GLOBAL_BATCH = 1 << 24
MAX_SEARCH_VIRTUAL = 64
MAX_SEARCH_LAYOUTS = 5000
MAX_MEMORY_CAP_BYTES = 1e15
MAX_FF_RATIO = 64.0
MAX_LR = 1e3
MAX_DEPTH_LR_MULT = 1e3
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


def _refuse(errors: list[tuple[tuple[str | int, ...], str]]) -> None:
    """Raise, from inside a validator, a refusal at the given locations (relative to the
    model being validated) rather than at the model itself: each (loc, reason)."""
    details = [
        InitErrorDetails(
            type=PydanticCustomError("refused", "{reason}", {"reason": reason}), loc=loc, input=None
        )
        for loc, reason in errors
    ]
    raise ValidationError.from_exception_data("JobSpec", details)


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
    Annotated[IntRange, Tag("range")]
    # at least one value (`_check_choices` refuses an empty list; the schema says so too)
    | Annotated[list[int], Field(json_schema_extra={"minItems": 1}), Tag("choices")],
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
    """A fixed parameter count: the width follows from the depth (`cost_model.budget`).

    By default the width is solved once per depth, for the Transformer without depth mixing
    (the standard residual's count), so that every variant of a depth has the same shape and
    the paired comparisons match them; a variant's own mixing parameters (a few vectors per
    sublayer) come on top. `per_variant: true` solves it for each variant's own total, which
    can give two variants of one depth different widths where the target falls between two."""

    params: float = Field(gt=0)
    tolerance: float = Field(default=0.1, gt=0, le=1)
    per_variant: bool = False


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
        if value not in COST_METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of {', '.join(COST_METRICS)}")
        return value


#: The training fields that may be searched (the contract's training axes), in this order.
TRAINING_AXES: tuple[str, ...] = ("lr", "depth_lr_mult", "warmup_frac", "weight_decay")


@dataclass(frozen=True)
class _Bounds:
    """The values a training axis takes: low < v (open) or low <= v, and v <= high."""

    low: float
    high: float
    open_low: bool = False

    def admits(self, value: float) -> bool:
        return (value > self.low if self.open_low else value >= self.low) and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"


#: Each training axis's bounds: lr in (0, MAX_LR], depth_lr_mult in [0, MAX_DEPTH_LR_MULT],
#: warmup_frac in [0, 1], weight_decay in [0, MAX_LR].
TRAINING_BOUNDS: dict[str, _Bounds] = {
    "lr": _Bounds(0.0, MAX_LR, open_low=True),
    "depth_lr_mult": _Bounds(0.0, MAX_DEPTH_LR_MULT),
    "warmup_frac": _Bounds(0.0, 1.0),
    "weight_decay": _Bounds(0.0, MAX_LR),
}


class FloatRange(_Strict):
    """A continuous range of a training axis, sampled uniformly in [low, high], or uniformly
    in ln v when `log` (both bounds then positive). A searched range is a study parameter
    (`suggest_float`); the grid sampler needs choices instead."""

    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.high < self.low:
            raise ValueError(f"inverted range: high {self.high:g} < low {self.low:g}")
        if self.high == self.low:
            raise ValueError(f"empty range: low = high = {self.low:g}; give a single value instead")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs positive bounds, got low {self.low:g}")
        return self


def _training_kind(value: Any) -> str:
    if isinstance(value, dict | FloatRange):
        return "range"
    return "choices" if isinstance(value, list | tuple) else "single"


#: A training axis: one value (fixed), choices `[1e-3, 3e-3]` or a range `{low, high, log}`.
TrainAxis = Annotated[
    Annotated[float, Tag("single")]
    | Annotated[list[float], Tag("choices")]
    | Annotated[FloatRange, Tag("range")],
    Discriminator(_training_kind),
]


def _number(value: Any) -> Any:
    """One value or one choice as given: refuse booleans, text that is not a number and
    non-finite numbers (also as strings: "NaN" from a JSON file read as YAML) on the field
    itself; pydantic converts the rest."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {number}")
    return value


def _numbers(value: Any) -> Any:
    """`_number` of a single value or of each choice (a range is left to `FloatRange`)."""
    if isinstance(value, dict | FloatRange):
        return value
    if isinstance(value, list | tuple):
        for v in value:
            _number(v)
        return value
    if not isinstance(value, int | float | str):
        raise ValueError("must be a number, a list of choices or a range {low, high, log}")
    return _number(value)


def _check_training_axis(name: str, value: float | list[float] | FloatRange) -> None:
    """`value` (one number, choices or a range) within the axis's bounds; choices distinct."""
    bounds = TRAINING_BOUNDS[name]
    if isinstance(value, FloatRange):
        for end in ("low", "high"):
            v = getattr(value, end)
            if not bounds.admits(v):
                raise ValueError(f"{end} {v:g} is outside {bounds}, the values {name} takes")
        return
    if isinstance(value, list):
        _check_choices(value, positive=False)
        for i, v in enumerate(value):
            if not bounds.admits(v):
                raise ValueError(f"value {i} ({v:g}) is outside {bounds}, the values {name} takes")
        return
    if not bounds.admits(value):
        raise ValueError(f"{value:g} is outside {bounds}, the values {name} takes")


class ByteTokens(_Strict):
    """One token per UTF-8 byte (256 ids): the default."""

    kind: Literal["byte"] = "byte"


class BpeTokens(_Strict):
    """A byte-level BPE of `vocab_size` ids trained by the workers on the corpus's training
    documents (`workers.tokenizer`); the architecture's vocabulary is then `vocab_size`, so
    the cost model prices its embedding and head."""

    kind: Literal["bpe"]
    vocab_size: int = Field(ge=MIN_BPE_VOCAB, le=MAX_BPE_VOCAB)


Tokenizer = Annotated[ByteTokens | BpeTokens, Field(discriminator="kind")]


class Training(_Strict):
    """How every candidate is trained: `TrainSpec`'s fields of the same names, except
    `ARCH_FIELDS`, which go to the architecture (`base_arch`). seq_len, batch_size and threads
    are bounded by the operator's limits (`check_job`); the corpus is a name registered by the
    operator or a path inside the data folder (`resolve_corpus`).

    The training axes (`TRAINING_AXES`: lr, depth_lr_mult, warmup_frac, weight_decay) each
    take one value (fixed), choices or a range (`FloatRange`): searched, they are joint axes,
    study parameters under their own names (`CandidateSpace.study_axes`). A trial's values of
    them are its setting (`nas_service.search.study.training_setting`); `depth_lr_mult` multiplies
    the learning rate of the depth-mixing parameters only."""

    ARCH_FIELDS: ClassVar[frozenset[str]] = frozenset({"vocab_size", "seq_len"})

    corpus: Text | None = Field(default=None, min_length=1, max_length=4096)  # None: built-in
    # the field of a JSON Lines or Parquet record that holds its text
    text_field: Text = Field(default="text", min_length=1, max_length=200)
    tokenizer: Tokenizer = Field(default_factory=ByteTokens)
    vocab_size: int = Field(default=256, ge=2, le=MAX_VOCAB)  # with a BPE: its vocab_size
    seq_len: int = Field(default=128, ge=2)
    batch_size: int = Field(default=16, ge=1)
    lr: TrainAxis = 3e-3
    depth_lr_mult: TrainAxis = 1.0
    schedule: Schedule = "cosine"
    warmup_frac: TrainAxis = 0.05
    decay_frac: float = Field(default=0.2, ge=0, lt=1)  # WSD's decay share (the last 20 %)
    weight_decay: TrainAxis = 0.1
    n_evals: int = Field(default=8, ge=1, le=MAX_EVALS)
    eval_batches: int = Field(default=8, ge=1, le=MAX_EVALS)
    threads: int | None = Field(default=None, ge=1)

    @field_validator(*TRAINING_AXES, mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        return _numbers(value)

    @model_validator(mode="before")
    @classmethod
    def _bpe_vocab(cls, data: Any) -> Any:
        """A BPE's vocabulary is the model's: vocab_size follows it unless given too."""
        if isinstance(data, dict):
            tok = data.get("tokenizer")
            if isinstance(tok, dict) and tok.get("kind") == "bpe" and "vocab_size" not in data:
                vocab = tok.get("vocab_size")
                if isinstance(vocab, int) and not isinstance(vocab, bool):
                    data = {**data, "vocab_size": vocab}
        return data

    @model_validator(mode="after")
    def _bpe_vocab_agrees(self) -> Training:
        if isinstance(self.tokenizer, BpeTokens) and self.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} differs from tokenizer.vocab_size "
                f"{self.tokenizer.vocab_size}: a BPE's vocabulary is the model's (leave "
                "vocab_size out)"
            )
        return self

    @field_validator("decay_frac", mode="before")
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        return _number(value)

    @field_validator(*TRAINING_AXES)
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        _check_training_axis(info.field_name, value)
        return value

    def searched(self) -> dict[str, list[float] | FloatRange]:
        """The joint training axes (those given as choices or a range), in `TRAINING_AXES`
        order."""
        out: dict[str, list[float] | FloatRange] = {}
        for name in TRAINING_AXES:
            value = getattr(self, name)
            if isinstance(value, list | FloatRange):
                out[name] = value
        return out

    def fixed(self) -> dict[str, float]:
        """The training axes given one value, in `TRAINING_AXES` order."""
        searched = self.searched()
        return {n: float(getattr(self, n)) for n in TRAINING_AXES if n not in searched}


class Tune(_Strict):
    """The per-shape nested grid: every architecture the sampler proposes is trained at each
    combination of the listed values (`itertools.product` in `TRAINING_AXES` order; the other
    axes at their fixed or joint value). Tune axes are never study parameters."""

    lr: list[float] | None = None
    depth_lr_mult: list[float] | None = None
    warmup_frac: list[float] | None = None
    weight_decay: list[float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        """An unknown key is refused on its own field (`tune.<key>`), naming the axes."""
        if isinstance(data, dict):
            unknown = [k for k in data if k not in TRAINING_AXES]
            if unknown:
                expected = ", ".join(TRAINING_AXES)
                _refuse(
                    [
                        ((str(k),), f"unknown training axis {k!r}; expected one of {expected}")
                        for k in unknown
                    ]
                )
        return data

    @field_validator(*TRAINING_AXES, mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list of values (tune is a grid)")
        return _numbers(value)

    @field_validator(*TRAINING_AXES)
    @classmethod
    def _bounded(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        assert info.field_name is not None
        if value is not None:
            _check_training_axis(info.field_name, value)
        return value

    def axes(self) -> dict[str, list[float]]:
        """The listed axes, in `TRAINING_AXES` order."""
        lists = ((n, getattr(self, n)) for n in TRAINING_AXES)
        return {n: list(v) for n, v in lists if v is not None}

    def size(self) -> int:
        """The number of settings: the product of the lists' lengths (counted, not built)."""
        return math.prod(len(v) for v in self.axes().values())


#: The fields `layout: auto` searches (and that it refuses to be given), and the fields only
#: `layout: auto` takes.
SEARCHED_LAYOUT_FIELDS = (
    "micro_batch",
    "microbatches",
    "recompute",
    "tensor",
    "pipeline",
    "virtual",
)
AUTO_LAYOUT_FIELDS = ("devices", "global_batch", "memory_cap_bytes", "max_virtual")


class StepCalibration(_Strict):
    """Efficiency factors of the step time on one device kind (`cost_model.calibration`):
    t = compute_factor · compute_s + memory_factor · memory_s + overhead_s. Filled in by the
    service when a job that names `calibrated_step_time_s` is submitted without one (the fit
    of its cluster's measured trials at that moment, so the job's trials stay comparable), or
    given by the user (factors from their own measurements)."""

    compute_factor: float = Field(ge=0, le=1e6)
    memory_factor: float = Field(ge=0, le=1e6)
    overhead_s: float = Field(ge=0, le=3600)
    device_kind: Text = Field(default="given", max_length=200)
    trials: int = Field(default=0, ge=0)  # the measured trials fitted (0: given by the user)

    @model_validator(mode="after")
    def _some_time(self) -> StepCalibration:
        if self.compute_factor == self.memory_factor == self.overhead_s == 0:
            raise ValueError("a calibration of all zeros predicts no time at all")
        return self


#: Ceilings of a described cluster's networks: bytes/s per device and direction (1 PB/s), and
#: seconds per message.
MAX_BANDWIDTH = 1e15
MAX_LATENCY_S = 1.0


class Cluster(_Strict):
    """A user's own cluster of the `hardware` preset's devices (its peaks, memory and
    efficiency fractions): `devices_per_node` devices per node joined by a network of
    `intra_node_bandwidth` bytes/s per device and direction (and `intra_node_latency_s` per
    message), nodes joined by one of `inter_node_bandwidth` (`inter_node_latency_s`);
    optionally `nodes` (the devices a layout may use: nodes × devices_per_node) and the
    achievable fractions of peak compute and memory bandwidth (default: the preset's)."""

    devices_per_node: int = Field(ge=1, le=MAX_DEVICES_PER_NODE)
    intra_node_bandwidth: float = Field(gt=0, le=MAX_BANDWIDTH)
    inter_node_bandwidth: float = Field(gt=0, le=MAX_BANDWIDTH)
    intra_node_latency_s: float = Field(default=0.0, ge=0, le=MAX_LATENCY_S)
    inter_node_latency_s: float = Field(default=0.0, ge=0, le=MAX_LATENCY_S)
    nodes: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    compute_efficiency: float | None = Field(default=None, gt=0, le=1)
    memory_efficiency: float | None = Field(default=None, gt=0, le=1)

    @property
    def devices(self) -> int | None:
        return None if self.nodes is None else self.nodes * self.devices_per_node

    def hardware(self, preset: Hardware) -> Hardware:
        """The preset's device in this cluster."""
        changes: dict[str, Any] = {
            "name": f"{preset.name} (own cluster)",
            "devices_per_node": self.devices_per_node,
            "link_bandwidth": self.intra_node_bandwidth,
            "inter_node_bandwidth": self.inter_node_bandwidth,
            "link_latency_s": self.intra_node_latency_s,
            "inter_node_latency_s": self.inter_node_latency_s,
        }
        for name in ("compute_efficiency", "memory_efficiency"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
                changes["efficiency_source"] = "given with the cluster"
        return preset.replace(**changes)


class CostContext(_Strict):
    """The workload, layout and hardware the cost metrics are computed for.

    `hardware` names a preset (one GPU of a DGX server, or the CPU); `cluster` describes the
    user's own nodes and networks around that device (`Cluster`). With `layout: auto`, the
    node size must divide `devices` (or `devices` one node), and `devices` must fit the
    cluster's `nodes`; with `layout: fixed`, tensor × pipeline ranks must.

    `layout: fixed` (the default): the layout given by `tensor`, `pipeline`, `virtual`,
    `micro_batch`, `microbatches` and `recompute`. `layout: auto`: each candidate at its
    fastest layout on `devices` devices for a global batch of `global_batch` sequences (default
    8 per device) within `memory_cap_bytes` per device (default: the hardware's memory), as
    `cost_model.search_layout` finds it among the layouts with up to `max_virtual` virtual
    stages; its metrics are priced at that layout, plus `cost_model.LAYOUT_METRICS`
    (`best_step_time_s`, `best_layout_*`). A candidate with no feasible layout is infeasible.
    """

    hardware: Text = Field(default="h100", max_length=64)
    micro_batch: int = Field(default=8, ge=1)
    seq_len: int | None = Field(default=None, ge=1)  # None: the training seq_len
    microbatches: int = Field(default=1, ge=1, le=MAX_MICROBATCHES)
    recompute: Literal["none", "selective", "full"] = "none"
    tensor: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    pipeline: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    virtual: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    decode_context: int | None = Field(default=None, ge=1)
    layout: Literal["fixed", "auto"] = "fixed"
    devices: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    memory_cap_bytes: float | None = Field(default=None, gt=0, le=MAX_MEMORY_CAP_BYTES)
    max_virtual: int = Field(default=4, ge=1, le=MAX_SEARCH_VIRTUAL)
    calibration: StepCalibration | None = None
    cluster: Cluster | None = None

    def hardware_model(self) -> Hardware:
        """The preset, in the user's cluster when one is described."""
        preset = get_hardware(self.hardware)
        return preset if self.cluster is None else self.cluster.hardware(preset)

    @model_validator(mode="after")
    def _fits_the_cluster(self) -> CostContext:
        """The devices a layout uses fit the nodes: a device count the node size divides
        (or one that divides a node), within the cluster's devices when it gives `nodes`."""
        hw = self.hardware_model()
        where = ("cluster", "devices_per_node") if self.cluster else ("devices",)
        total = self.cluster.devices if self.cluster else None
        if self.layout == "auto" and self.devices is not None:
            try:
                hw.check_devices(self.devices, "devices")
            except CostInputError as exc:
                _refuse([(where, exc.reason)])
            if total is not None and self.devices > total:
                _refuse([(("devices",), f"more than the cluster's {total} devices")])
        if self.layout == "fixed" and total is not None:
            if self.tensor > total:
                _refuse([(("tensor",), f"{self.tensor} ranks, more than the cluster's {total}")])
            if self.tensor * self.pipeline > total:
                _refuse([(("pipeline",), f"tensor × pipeline ranks exceed the cluster's {total}")])
        return self

    @model_validator(mode="after")
    def _layout_fields(self, info: ValidationInfo) -> CostContext:
        """`layout: auto` needs `devices` and searches the layout fields (one set to other
        than its default is refused, not ignored); `layout: fixed` takes none of the search's
        fields. The search's size is bounded (`MAX_SEARCH_LAYOUTS`) here, before any candidate
        is priced, but for a stored spec read back (context `stored`: counted at its
        submission). A field at its default counts as not given, so that a stored spec
        (`model_dump`, every field written out) reads back."""
        fields = type(self).model_fields
        given = {f for f in fields if getattr(self, f) != fields[f].default}
        if self.layout == "fixed":
            extra = [f for f in AUTO_LAYOUT_FIELDS if f in given]
            if extra:
                _refuse([((f,), "only with layout: auto") for f in extra])
            return self
        searched = [f for f in SEARCHED_LAYOUT_FIELDS if f in given]
        if searched:
            _refuse([((f,), "layout: auto searches it; leave it out") for f in searched])
        if self.devices is None:
            _refuse([(("devices",), "layout: auto needs the number of devices")])
        if isinstance(info.context, dict) and info.context.get("stored"):
            return self
        try:
            self.layout_space().layouts()
        except CostInputError as exc:
            _refuse([((exc.field,), exc.reason)])
        return self

    def layout_space(self) -> LayoutSpace:
        """The layouts `layout: auto` searches (only with `layout: auto`)."""
        assert self.devices is not None
        batch = self.global_batch or Workload().micro_batch * self.devices
        return LayoutSpace(
            devices=self.devices,
            global_batch=batch,
            max_virtual=self.max_virtual,
            max_layouts=MAX_SEARCH_LAYOUTS,
        )

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


#: The most rungs of a fidelity ladder, and the largest reduction factor η.
MAX_RUNGS = 8
MAX_REDUCTION = 100.0


class Fidelity(_Strict):
    """Multi-fidelity search (successive halving): every candidate trains first on the
    smallest rung's share of its budget, and only the best 1/`reduction` of the results at a
    rung go on to the next (ASHA: as soon as they are among the best, asynchronously). With
    `brackets` > 1, Hyperband: bracket b's candidates start at rung b, trials spread over the
    brackets in Hyperband's proportions (`nas_service.search.fidelity.bracket_of`).

    `rungs` are fractions of each candidate's budget, strictly increasing, in (0, 1], the
    last exactly 1 (the full budget). `reuse`: `checkpoint` resumes a promoted candidate from
    its checkpoint at the rung it reached and scores each rung on a short decay branch
    (exact: only under the WSD schedule, whose stable phase does not depend on where a run
    stops; every non-final rung must then lie in the stable phase, ≤ 1 − decay_frac);
    `retrain` trains each rung from scratch on its share of the budget (any schedule)."""

    rungs: list[float] = Field(min_length=2, max_length=MAX_RUNGS)
    reduction: float = Field(default=3.0, gt=1, le=MAX_REDUCTION)
    brackets: int = Field(default=1, ge=1, le=MAX_RUNGS)
    reuse: Literal["checkpoint", "retrain"] = "checkpoint"

    @field_validator("rungs", mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            for v in value:
                _number(v)
        return value

    @field_validator("reduction", mode="before")
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        return _number(value)

    @field_validator("rungs")
    @classmethod
    def _ladder(cls, value: list[float]) -> list[float]:
        for i, v in enumerate(value):
            if not 0 < v <= 1:
                raise ValueError(f"rung {i} ({v:g}) is outside (0, 1], the fractions of a budget")
        for i in range(1, len(value)):
            if value[i] <= value[i - 1]:
                raise ValueError(
                    f"rungs must be strictly increasing: rung {i} ({value[i]:g}) is not above "
                    f"rung {i - 1} ({value[i - 1]:g})"
                )
        if value[-1] != 1:
            raise ValueError(
                f"the last rung must be 1 (the full budget), got {value[-1]:g}: the search "
                "ends on fully trained candidates"
            )
        return value

    @model_validator(mode="after")
    def _brackets(self) -> Fidelity:
        if self.brackets > len(self.rungs):
            _refuse(
                [
                    (
                        ("brackets",),
                        f"{self.brackets} brackets, more than the {len(self.rungs)} rungs: "
                        "bracket b starts at rung b",
                    )
                ]
            )
        return self


class JobSpec(_Strict):
    name: Text = Field(min_length=1, max_length=200)
    space: SearchSpace
    budget: Budget
    objectives: list[Text] = Field(default_factory=lambda: [LOSS])
    constraints: list[Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    sampler: Literal["tpe", "nsga2", "random", "grid"] = "tpe"
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
    cost: CostContext = Field(default_factory=CostContext)
    cluster: Text = Field(default="local", min_length=1, max_length=100)
    fidelity: Fidelity | None = None  # None: every candidate trains on its full budget

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
        if self.sampler == "grid":
            for name, value in joint.items():
                if isinstance(value, FloatRange):
                    errors.append(
                        (("training", name), "the grid sampler needs choices, not a range")
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
    def runs(self) -> int:
        """Training runs of the whole job: n_trials × seeds × `tune_size`."""
        return self.n_trials * self.seeds * self.tune_size

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
