"""The main job's closing sentence (`nas_service.demo.answer_line`): the standard residual's
best shape at the budget, where each other variant moves it, and why no shape can be named
when the fit cannot place one."""

from __future__ import annotations

from typing import Any

from nas_service.demo import answer_line


def _fit(variant: str, verdict: str, ratio: float | None, low: float, high: float) -> Any:
    return {
        "variant": variant,
        "verdict": verdict,
        "optimum_ratio": ratio,
        "ci_low": low if ratio is not None else None,
        "ci_high": high if ratio is not None else None,
        "best_observed": {"n_layers": 3, "d_model": 48},
        "message": "the shallowest shape is best here: explore shallower shapes",
    }


def test_a_variant_that_moves_the_optimum_deeper_is_said_so() -> None:
    line = answer_line(
        [_fit("baseline", "ok", 60.0, 50.0, 70.0), _fit("block_attnres", "ok", 40.0, 30.0, 45.0)]
    )
    assert line.startswith("At this budget the best baseline shape is d_model/L_b ≈ 60")
    assert "(90% interval 50–70)" in line and "L_b = 3, d_model = 48" in line
    assert "block_attnres moves it deeper and narrower, to d_model/L_b ≈ 40" in line
    assert "1.50× smaller d_model/L_b; the intervals do not overlap" in line


def test_overlapping_intervals_do_not_separate_the_variants() -> None:
    line = answer_line(
        [_fit("baseline", "ok", 40.0, 30.0, 50.0), _fit("block_attnres", "ok", 48.0, 35.0, 60.0)]
    )
    assert "shallower and wider" in line and "1.20× larger" in line
    assert "the intervals overlap, so this job does not separate the two" in line


def test_an_optimum_at_the_edge_names_no_shape() -> None:
    line = answer_line(
        [_fit("baseline", "at_edge", None, 0, 0), _fit("block_attnres", "ok", 40.0, 30, 50)]
    )
    assert line.startswith("At this budget the baseline optimum cannot be placed")
    assert "(at_edge)" in line and "explore shallower shapes" in line
