"""The roofline calibration (`cost_model.calibration`): NNLS against an exhaustive search of
its active sets, exact recovery of a known step model without noise, bounded recovery with
noise, the cross-validation's folds and errors, and refusals naming the field."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cost_model.calibration import (
    MIN_TRIALS,
    TERMS,
    CalibrationError,
    cross_validate,
    fit_step_model,
    nnls,
    relative_errors,
)


def brute_force_nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The NNLS optimum by enumeration: the least-squares solution on every subset of the
    columns, the best one that is non-negative (the optimum is one of them: KKT)."""
    n = a.shape[1]
    best, best_x = np.inf, np.zeros(n)
    for k in range(1, n + 1):
        for subset in itertools.combinations(range(n), k):
            cols = list(subset)
            sol = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
            if (sol < 0).any():
                continue
            x = np.zeros(n)
            x[cols] = sol
            r = float(np.sum((a @ x - y) ** 2))
            if r < best:
                best, best_x = r, x
    if float(np.sum(y**2)) <= best:
        return np.zeros(n)
    return best_x


@pytest.mark.parametrize("seed", range(40))
def test_nnls_equals_the_best_non_negative_active_set(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(4, 30)), int(rng.integers(1, 6))
    a = rng.normal(size=(m, n)) * rng.uniform(0.01, 100, size=n)  # columns of mixed scale
    y = rng.normal(size=m)
    x = nnls(a, y)
    expected = brute_force_nnls(a, y)
    assert (x >= 0).all()
    np.testing.assert_allclose(
        np.sum((a @ x - y) ** 2), np.sum((a @ expected - y) ** 2), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-9)


def test_nnls_zero_column_and_negative_target() -> None:
    a = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    assert nnls(a, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 0.0])
    assert nnls(a, -np.array([1.0, 2.0, 3.0])) == pytest.approx([0.0, 0.0])


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Roofline terms spanning three decades, compute and memory not proportional."""
    rng = np.random.default_rng(seed)
    compute = 10 ** rng.uniform(-4, -1, n)
    memory = compute * 10 ** rng.uniform(-1, 1, n)
    return compute, memory


def test_a_known_model_is_recovered_exactly_without_noise() -> None:
    compute, memory = synthetic(30, 0)
    a, b, c = 2.5, 4.0, 3e-3
    measured = a * compute + b * memory + c
    model = fit_step_model(compute, memory, measured)
    assert (model.compute_factor, model.memory_factor, model.overhead_s) == pytest.approx(
        (a, b, c), rel=1e-9
    )
    assert model.compute_efficiency == pytest.approx(1 / a)
    assert model.bandwidth_efficiency == pytest.approx(1 / b)
    assert model.rows == 30
    cv = cross_validate(compute, memory, measured, np.maximum(compute, memory))
    assert cv.median_error < 1e-9 and cv.p90_error < 1e-9
    assert cv.roofline_median_error > 0.5  # the raw roofline is a lower bound, far below


def test_a_term_that_explains_nothing_is_zero_not_negative() -> None:
    compute, memory = synthetic(20, 1)
    measured = 3.0 * compute + 1e-3  # memory plays no part
    model = fit_step_model(compute, memory, measured)
    assert model.memory_factor == pytest.approx(0.0, abs=1e-9)
    assert model.bandwidth_efficiency is None
    assert (model.compute_factor, model.overhead_s) == pytest.approx((3.0, 1e-3), rel=1e-9)


def test_noise_is_bounded() -> None:
    """Multiplicative noise of 5% (log-normal σ = 0.05): the factors within 15%, the
    cross-validated median error near the noise's own median |ε| (≈ 0.67σ)."""
    compute, memory = synthetic(200, 2)
    a, b, c = 2.0, 5.0, 2e-3
    rng = np.random.default_rng(3)
    measured = (a * compute + b * memory + c) * np.exp(rng.normal(0, 0.05, compute.size))
    model = fit_step_model(compute, memory, measured)
    assert model.compute_factor == pytest.approx(a, rel=0.15)
    assert model.memory_factor == pytest.approx(b, rel=0.15)
    assert model.overhead_s == pytest.approx(c, rel=0.15)
    cv = cross_validate(compute, memory, measured, np.maximum(compute, memory))
    assert 0.02 < cv.median_error < 0.05
    assert cv.median_error <= cv.p90_error < 0.12
    assert cv.folds == 10


def test_the_fit_is_relative_the_small_steps_count() -> None:
    """An absolute least-squares fit is decided by the slow steps; the relative one keeps the
    fast steps' overhead: c is recovered though every fast step is a hundred times smaller."""
    compute = np.array([1e-4, 2e-4, 3e-4, 1.0, 2.0, 3.0, 1.5, 2.5])
    memory = compute * np.array([1.0, 0.5, 2.0, 1.0, 0.5, 2.0, 1.2, 0.8])
    measured = 2.0 * compute + 3.0 * memory + 1e-3
    measured[3:] *= np.array([1.02, 0.98, 1.03, 0.99, 1.01])  # the slow steps a few % off
    model = fit_step_model(compute, memory, measured)
    assert model.overhead_s == pytest.approx(1e-3, rel=0.1)
    absolute = nnls(np.stack([compute, memory, np.ones(8)], axis=1), measured)
    assert absolute[2] < 0.5e-3  # unweighted, c is lost in the slow steps' residuals


def test_leave_one_out_below_ten_rows_and_out_of_fold_predictions() -> None:
    compute, memory = synthetic(MIN_TRIALS, 4)
    measured = 2 * compute + 3 * memory + 1e-3
    measured[0] *= 3  # an outlier: only its own prediction misses it, out of fold
    cv = cross_validate(compute, memory, measured, compute)
    assert cv.folds == MIN_TRIALS
    alone = fit_step_model(compute[1:], memory[1:], measured[1:])
    assert cv.predicted_s[0] == pytest.approx(alone.predict(compute[0], memory[0]))
    assert cv.errors[0] == pytest.approx(relative_errors(cv.predicted_s[0], measured[0]))
    assert cv.errors[0] > 0.5


@pytest.mark.parametrize(
    ("columns", "field"),
    [
        (([1.0, 2.0], [1.0, 2.0], [1.0, 2.0]), "rows"),  # fewer rows than terms
        (([1.0, 2.0, 3.0], [1.0, 2.0], [1.0, 2.0, 3.0]), "rows"),
        (([1.0, np.nan, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]), "compute_s"),
        (([1.0, 2.0, 3.0], [1.0, -2.0, 3.0], [1.0, 2.0, 3.0]), "compute_s"),
        (([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 0.0, 3.0]), "measured_s"),
        (([1.0, 2.0, 3.0], [1.0, 2.0, np.inf], [1.0, 2.0, 3.0]), "memory_s"),
    ],
)
def test_bad_rows_are_refused_naming_the_field(
    columns: tuple[list[float], ...], field: str
) -> None:
    with pytest.raises(CalibrationError) as info:
        fit_step_model(*columns)
    assert info.value.field == field


def test_cross_validation_refusals() -> None:
    compute, memory = synthetic(10, 5)
    measured = compute + memory
    with pytest.raises(CalibrationError, match="folds"):
        cross_validate(compute, memory, measured, compute, folds=1)
    with pytest.raises(CalibrationError) as info:
        cross_validate(compute, memory, measured, compute[:5])
    assert info.value.field == "roofline_s"
    with pytest.raises(CalibrationError) as info:
        cross_validate(compute[: len(TERMS)], memory[:3], measured[:3], compute[:3])
    assert info.value.field == "rows"
