"""The finite-number helpers (`nas_service.search.numbers`): one name per meaning."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from nas_service.search.numbers import finite_or_inf, finite_or_none, is_finite


@pytest.mark.parametrize("value", [0, 3, -2.5, 1e300, np.float64(0.5)])
def test_a_finite_real_number_is_finite(value: Any) -> None:
    assert is_finite(value)
    out = finite_or_none(value)
    assert out == float(value) and type(out) is float


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, True, False, None, "1.0", [1.0], {"x": 1}]
)
def test_anything_else_is_not(value: Any) -> None:
    """Not NaN or an infinity, not a bool (an int to Python), not a string that reads as one."""
    assert not is_finite(value)
    assert finite_or_none(value) is None


def test_finite_or_inf_makes_every_non_finite_value_the_worst() -> None:
    assert finite_or_inf(2.5) == 2.5
    assert finite_or_inf(-7.0) == -7.0
    assert finite_or_inf(math.nan) == math.inf
    assert finite_or_inf(-math.inf) == math.inf
    assert finite_or_inf(math.inf) == math.inf
