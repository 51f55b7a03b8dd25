"""The compute each candidate trains on (`Budget`: FLOPs or tokens, one value or a searched
list) and how that budget is handed out in rungs (`Fidelity`: successive halving,
Hyperband)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nas_service.spec.fields import (
    _check_choices,
    _integral_floats,
    _number,
    _one_or_many,
    _refuse,
    _Strict,
)

#: A budget: one value, or several (a searched axis).
FloatBudget = Annotated[
    Annotated[float, Tag("single")] | Annotated[list[float], Tag("choices")],
    Discriminator(_one_or_many),
]
IntBudget = Annotated[
    Annotated[int, Tag("single")] | Annotated[list[int], Tag("choices")],
    Discriminator(_one_or_many),
]


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
