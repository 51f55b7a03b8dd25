"""What every section of the job spec shares: the ceilings of its fields, the refusal
(`SpecError`, `_refuse`), printable `Text`, the strict base model, integer axes
(`IntRange`, `IntAxis`) and the validators of numbers and choices."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

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
