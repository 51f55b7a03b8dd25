"""Finite numbers, one name per meaning: whether a value is a finite real number
(`is_finite`), a value as a finite float or None (`finite_or_none`: what the service stores and
serves for a loss that diverged or is missing), and a float with every non-finite value as +inf
(`finite_or_inf`: the worst value a minimised objective can take, for comparisons).

A bool is not a number here (`True` is an `int` to Python), nor is a string."""

from __future__ import annotations

import math
from typing import Any


def is_finite(value: Any) -> bool:
    """Whether `value` is an int or a float (not a bool) and finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def finite_or_none(value: Any) -> float | None:
    """`value` as a float where it is a finite number (`is_finite`), else None."""
    return float(value) if is_finite(value) else None


def finite_or_inf(value: float) -> float:
    """`value` where it is finite, else +inf (NaN and -inf included)."""
    return value if math.isfinite(value) else math.inf
