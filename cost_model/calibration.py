"""Calibration of the roofline against measured training steps.

The roofline (`cost_model.timing.train_step_time`) is a lower bound: a real step reaches a
fraction of the peak FLOP/s and of the memory bandwidth, and pays a fixed cost per step
(the Python interpreter, kernel launches, the optimizer's loop over tensors). The model of a
measured step time t is linear in the roofline's terms:

    t ≈ a · compute_s + b · memory_s + c

with compute_s = FLOPs / peak FLOP/s and memory_s = bytes / bandwidth (the `RooflineTime`
terms), a = 1 / (achieved fraction of peak FLOP/s), b = 1 / (achieved fraction of bandwidth)
and c the fixed overhead per step in seconds. The terms add (no overlap assumed), as in
"Roofline: an insightful visual performance model" (Williams, Waterman and Patterson, CACM
2009) read as a time model, whose max() is the perfectly overlapped limit.

The roofline's terms are at the preset's achievable rates (`Hardware.compute_efficiency`,
`memory_efficiency`; 1 for the CPU, whose peaks are measured): on a GPU preset a and b are
then relative to those rates, not to the datasheet, and a fit with measurements replaces the
default fractions (a·compute_s is the measured compute time however compute_s was derated).

The fit: a, b, c ≥ 0 by non-negative least squares (`nnls`, Lawson and Hanson, "Solving Least
Squares Problems", 1974, ch. 23) of the *relative* residuals, i.e. every row divided by its
measured time: minimise Σᵢ ((a·Cᵢ + b·Mᵢ + c − tᵢ) / tᵢ)². Steps span orders of magnitude; an
absolute fit would be decided by the few slowest steps and leave the fast ones with large
relative errors.

The error reported is cross-validated (`cross_validate`): `CV_FOLDS`-fold (leave-one-out
below that many rows), the fold of row i being i mod k, each row predicted by the model
fitted without its fold; the median and 90th percentile of |pred − meas| / meas, beside the
same statistics of the uncalibrated roofline. `MIN_TRIALS` rows are needed before a
calibration is offered (the service says how many more are missing).

Standard library and numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model._config import CostInputError
from cost_model.hardware import RooflineTime

#: The fitted terms, in the order of the design matrix's columns.
TERMS = ("compute_s", "memory_s", "overhead_s")
#: Rows (trials) below which a calibration is not offered: 3 unknowns, and at least 5 more
#: rows so that each cross-validation fold is fitted on more rows than unknowns twice over.
MIN_TRIALS = 8
#: Folds of the cross-validation (leave-one-out with fewer rows).
CV_FOLDS = 10
#: The percentile reported beside the median.
TAIL_PERCENTILE = 90.0


class CalibrationError(CostInputError):
    """Rows a calibration cannot be fitted from (`field`, `reason`)."""


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x ≥ 0 minimising ‖A·x − y‖₂: the active-set method of Lawson and Hanson ("Solving Least
    Squares Problems", 1974, algorithm NNLS of ch. 23).

    Variables move from the zero set Z to the passive set P by largest gradient
    w = Aᵀ(y − A·x); on P the unconstrained least-squares solution s is taken, stepping back
    towards the last feasible x (and returning variables to Z) while some s_j ≤ 0. Stops when
    no variable of Z has a positive gradient (the KKT conditions). Columns are scaled to unit
    norm first (the solution is invariant under positive column scaling); an all-zero column
    gets 0."""
    a = np.asarray(a, dtype=float)
    y = np.asarray(y, dtype=float)
    if a.ndim != 2 or y.shape != (a.shape[0],):
        raise CalibrationError("rows", f"need A of shape (m, n) and y of (m,), got {a.shape}")
    m, n = a.shape
    norms = np.linalg.norm(a, axis=0)
    usable = norms > 0
    scaled = np.where(usable, a / np.where(usable, norms, 1.0), 0.0)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(scaled).sum(axis=0).max()))
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = scaled.T @ (y - scaled @ x)
    for _ in range(3 * n + 10):
        candidates = ~passive & usable & (w > tol)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, w, -np.inf)))] = True
        for _ in range(3 * n + 10):
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(scaled[:, passive], y, rcond=None)[0]
            if (s[passive] > tol).all():
                break
            blocking = passive & (s <= tol)
            step = x[blocking] - s[blocking]  # > 0 but for a variable just added at 0
            alpha = float(np.min(np.where(step > 0, x[blocking] / np.where(step > 0, step, 1), 0)))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
        w = scaled.T @ (y - scaled @ x)
    return np.where(usable, x / np.where(usable, norms, 1.0), 0.0)


@dataclass(frozen=True)
class StepModel:
    """A fitted step-time model: t = a·compute_s + b·memory_s + c (see the module)."""

    compute_factor: float  # a = 1 / achieved fraction of the roofline's FLOP/s
    memory_factor: float  # b = 1 / achieved fraction of memory bandwidth
    overhead_s: float  # c, seconds per step
    rows: int  # rows it was fitted on

    def predict(self, compute_s: Any, memory_s: Any) -> Any:
        """Calibrated step time in seconds (one candidate or arrays)."""
        return self.compute_factor * compute_s + self.memory_factor * memory_s + self.overhead_s

    def step_time(self, roofline: RooflineTime) -> Any:
        """The calibrated time of a step the roofline prices (one candidate or arrays): the
        fitted busy time `predict(compute_s, memory_s)`, stretched by the roofline's pipeline
        bubble (the same fraction of the busy time), plus its communication time. A fit on
        single-device steps measures neither link nor bubble, so those stay as the roofline
        has them."""
        busy = np.maximum(roofline.compute_s, roofline.memory_s)
        bubble = np.where(busy > 0, roofline.bubble_s / np.where(busy > 0, busy, 1.0), 0.0)
        fitted = self.predict(roofline.compute_s, roofline.memory_s)
        return fitted * (1.0 + bubble) + roofline.comm_s

    @property
    def compute_efficiency(self) -> float | None:
        """Achieved fraction of peak FLOP/s, 1/a (None when a = 0: compute explained nothing)."""
        return 1.0 / self.compute_factor if self.compute_factor > 0 else None

    @property
    def bandwidth_efficiency(self) -> float | None:
        """Achieved fraction of memory bandwidth, 1/b (None when b = 0)."""
        return 1.0 / self.memory_factor if self.memory_factor > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute_factor": self.compute_factor,
            "memory_factor": self.memory_factor,
            "overhead_s": self.overhead_s,
            "compute_efficiency": self.compute_efficiency,
            "bandwidth_efficiency": self.bandwidth_efficiency,
            "rows": self.rows,
        }


def _columns(compute_s: Any, memory_s: Any, measured_s: Any) -> tuple[np.ndarray, ...]:
    """The three columns as float arrays, checked: one length, finite, terms ≥ 0, times > 0."""
    cols = tuple(np.asarray(v, dtype=float).reshape(-1) for v in (compute_s, memory_s, measured_s))
    if len({c.size for c in cols}) != 1:
        raise CalibrationError("rows", f"columns of different lengths {[c.size for c in cols]}")
    for name, col in zip(("compute_s", "memory_s", "measured_s"), cols, strict=True):
        if not np.isfinite(col).all():
            raise CalibrationError(name, "must be finite")
    if (cols[0] < 0).any() or (cols[1] < 0).any():
        raise CalibrationError("compute_s", "roofline terms must be non-negative")
    if not (cols[2] > 0).all():
        raise CalibrationError("measured_s", "measured step times must be positive")
    return cols


def fit_step_model(compute_s: Any, memory_s: Any, measured_s: Any) -> StepModel:
    """a, b, c ≥ 0 minimising Σᵢ ((a·Cᵢ + b·Mᵢ + c − tᵢ)/tᵢ)² (`nnls` on the rows divided by
    tᵢ: the relative error). Needs at least `len(TERMS)` rows."""
    c, m, t = _columns(compute_s, memory_s, measured_s)
    if t.size < len(TERMS):
        raise CalibrationError("rows", f"need at least {len(TERMS)} rows, got {t.size}")
    design = np.stack([c, m, np.ones_like(t)], axis=1) / t[:, None]
    a, b, overhead = nnls(design, np.ones_like(t))
    return StepModel(float(a), float(b), float(overhead), int(t.size))


def relative_errors(predicted_s: Any, measured_s: Any) -> np.ndarray:
    """|pred − meas| / meas, element-wise."""
    pred = np.asarray(predicted_s, dtype=float)
    meas = np.asarray(measured_s, dtype=float)
    out: np.ndarray = np.abs(pred - meas) / meas
    return out


@dataclass(frozen=True)
class CrossValidation:
    """Out-of-fold predictions and their relative errors, and the raw roofline's beside them."""

    folds: int
    predicted_s: np.ndarray  # each row predicted by the model fitted without its fold
    errors: np.ndarray  # |pred − meas| / meas of the calibrated model, out of fold
    roofline_errors: np.ndarray  # the same of the uncalibrated roofline

    @property
    def median_error(self) -> float:
        return float(np.median(self.errors))

    @property
    def p90_error(self) -> float:
        return float(np.percentile(self.errors, TAIL_PERCENTILE))

    @property
    def roofline_median_error(self) -> float:
        return float(np.median(self.roofline_errors))

    @property
    def roofline_p90_error(self) -> float:
        return float(np.percentile(self.roofline_errors, TAIL_PERCENTILE))

    def as_dict(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "median_error": self.median_error,
            "p90_error": self.p90_error,
            "roofline_median_error": self.roofline_median_error,
            "roofline_p90_error": self.roofline_p90_error,
        }


def cross_validate(
    compute_s: Any, memory_s: Any, measured_s: Any, roofline_s: Any, folds: int = CV_FOLDS
) -> CrossValidation:
    """k-fold cross-validation of `fit_step_model` with k = min(folds, rows) (leave-one-out
    when rows ≤ folds), row i in fold i mod k: each fold predicted by the model fitted on the
    others. `roofline_s` (the uncalibrated estimate, e.g. `RooflineTime.total_s`) is scored
    on the same rows. Needs `len(TERMS) + 1` rows at least (every training set must fit)."""
    c, m, t = _columns(compute_s, memory_s, measured_s)
    raw = np.asarray(roofline_s, dtype=float).reshape(-1)
    if raw.size != t.size:
        raise CalibrationError("roofline_s", f"has {raw.size} rows, the measurements {t.size}")
    if folds < 2:
        raise CalibrationError("folds", f"must be at least 2, got {folds}")
    n = t.size
    if n < len(TERMS) + 1:
        raise CalibrationError("rows", f"need at least {len(TERMS) + 1} rows, got {n}")
    k = min(folds, n)
    fold = np.arange(n) % k
    if (np.bincount(fold, minlength=k) > n - len(TERMS)).any():  # a training set too small
        raise CalibrationError("rows", f"{n} rows leave a fold with fewer than {len(TERMS)}")
    predicted = np.empty(n)
    for f in range(k):
        held = fold == f
        model = fit_step_model(c[~held], m[~held], t[~held])
        predicted[held] = model.predict(c[held], m[held])
    return CrossValidation(
        folds=k,
        predicted_s=predicted,
        errors=relative_errors(predicted, t),
        roofline_errors=relative_errors(raw, t),
    )
