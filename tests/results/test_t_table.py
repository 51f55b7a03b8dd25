"""`analysis.t_quantile` pinned to a printed Student t table (one-sided upper quantiles, three
decimals), at every level an interval uses, and symmetric below 0.5."""

from __future__ import annotations

import pytest

from nas_service.results.analysis import t_quantile

LEVELS = (0.90, 0.95, 0.975, 0.99, 0.995)
TABLE = {
    1: (3.078, 6.314, 12.706, 31.821, 63.657),
    2: (1.886, 2.920, 4.303, 6.965, 9.925),
    3: (1.638, 2.353, 3.182, 4.541, 5.841),
    5: (1.476, 2.015, 2.571, 3.365, 4.032),
    10: (1.372, 1.812, 2.228, 2.764, 3.169),
    30: (1.310, 1.697, 2.042, 2.457, 2.750),
}


@pytest.mark.parametrize("df", list(TABLE))
def test_t_quantile_equals_the_printed_table(df: int) -> None:
    for p, value in zip(LEVELS, TABLE[df], strict=True):
        assert t_quantile(p, df) == pytest.approx(value, abs=5e-4), (p, df)
        assert t_quantile(1 - p, df) == pytest.approx(-value, abs=5e-4), (1 - p, df)
