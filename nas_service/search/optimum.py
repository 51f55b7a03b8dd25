"""The loss-optimal d_model/L_b of one residual variant: loss against x = ln(d_model/L_b)
fitted by a quadratic, the optimum its vertex, with an interval from the fit's sampling
distribution. The results answer it (`results.answers.optimum_by_variant`); a job that asks
to stop once it is located (`stop: {optimum_interval}`) has its scheduler fit it as trials
finish (`search.scheduler`).

Pure numpy."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas_service.store.records import TrialAttr

#: |ln(d_model/L_b)| beyond which a fitted vertex is no shape (e^700 is near float's limit)
MAX_LN_RATIO = 700.0

#: The fewest trained shapes (points) per variant on which `located` may say "located": six
#: leave three degrees of freedom beyond the quadratic's three coefficients. On fewer, a fit
#: that happens to pass close to its points has a tiny scatter and a narrow interval, and a
#: search that stops at the first narrow interval would stop on it (`docs/search.md`).
LOCATED_MIN_POINTS = 6

#: A column of numbers: a sequence or a 1-D array (read with np.asarray).
Floats = Sequence[float] | np.ndarray


@dataclass
class OptimumFit:
    """Loss against x = ln(d_model / L_b) for one variant at matched compute, fitted by a
    quadratic; the optimum is its vertex."""

    variant: str
    n_trials: int
    n_shapes: int
    verdict: str  # "ok", "at_edge", "no_minimum", "too_few_shapes"
    optimum_ratio: float | None = None  # d_model / L_b at the fitted minimum
    ci_low: float | None = None
    ci_high: float | None = None
    fitted_loss: float | None = None
    coefficients: list[float] = field(default_factory=list)  # a, b, c of a·x² + b·x + c
    explored: tuple[float, float] | None = None  # ratio range of the data
    best_observed: dict[str, Any] | None = None
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _quadratic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.polyfit(x, y, 2)


def _vertex_draws(x: np.ndarray, y: np.ndarray, draws: int, seed: int) -> tuple[np.ndarray, int]:
    """Draws of the vertex −b/2a from the sampling distribution of the least-squares
    quadratic, and how many draws opened downwards (dropped).

    With X = [x², x, 1], β̂ the least-squares fit, s² = RSS/(n − 3) and Gaussian errors,
    (β̂ − β)/s is multivariate Student t with n − 3 degrees of freedom and scale (XᵀX)⁻¹; a
    draw is β̂ + s·L·z·√((n − 3)/χ²ₙ₋₃) with L Lᵀ = (XᵀX)⁻¹ and z standard normal (the
    posterior of β under the reference prior, Gelman et al., Bayesian Data Analysis, §14.2).
    A percentile bootstrap over trials under-covers on a few shapes: resampling cannot see
    the noise between the points it happens to draw, nor the uncertainty of the noise level
    itself (the coverage is tested in the analysis tests)."""
    n = len(x)
    dof = n - 3
    if draws <= 0 or dof <= 0:
        return np.zeros(0), 0
    X = np.stack([x**2, x, np.ones_like(x)], axis=1)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    s2 = float(np.sum((y - X @ beta) ** 2)) / dof
    chol = np.linalg.cholesky(np.linalg.inv(X.T @ X))
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((draws, 3))
    scale = np.sqrt(s2 * dof / rng.chisquare(dof, (draws, 1)))
    coef = beta[None, :] + scale * (z @ chol.T)
    a, b = coef[:, 0], coef[:, 1]
    up = a > 0
    vertices: np.ndarray = -b[up] / (2 * a[up])
    return vertices, int(draws - up.sum())


def fit_optimum(
    variant: str,
    ratios: Floats,
    losses: Floats,
    bootstrap: int = 200,
    seed: int = 0,
    level: float = 0.9,
    best_observed: dict[str, Any] | None = None,
) -> OptimumFit:
    """The loss-optimal d_model/L_b (Attention Residuals §5.4.1 defines it per Transformer
    block): a quadratic fit of loss against x = ln(ratio), the optimum its vertex −b/2a.

    The interval: the `level` percentiles of `bootstrap` draws of the vertex from the fit's
    sampling distribution (`_vertex_draws`: Student t with n − 3 degrees of freedom on the
    coefficients, so it widens with the scatter about the curve and with few points, and
    narrows as shapes or seeds are added). Draws opening downwards are dropped; when more
    than 1 − `level` of them do, the interval is unbounded and none is given. Verdicts:
    `too_few_shapes` under three distinct ratios; `no_minimum` when the fit opens downwards;
    `at_edge` when the vertex lies outside the explored ratios (the data cannot locate a
    minimum: widen the space)."""
    r = np.asarray(ratios, dtype=float)
    y = np.asarray(losses, dtype=float)
    ok = np.isfinite(r) & np.isfinite(y) & (r > 0)
    r, y = r[ok], y[ok]
    x = np.log(r)
    shapes = len(np.unique(np.round(x, 9)))
    fit = OptimumFit(variant, len(y), shapes, "too_few_shapes", best_observed=best_observed)
    if len(y):
        fit.explored = (float(r.min()), float(r.max()))
    if shapes < 3:
        fit.message = f"{shapes} distinct shapes; at least 3 are needed to locate a minimum"
        return fit
    a, b, c = _quadratic(x, y)
    fit.coefficients = [float(a), float(b), float(c)]
    if a <= 0:
        fit.verdict = "no_minimum"
        fit.message = "the loss does not curve upwards around the explored shapes"
        return fit
    x_star = -b / (2 * a)
    if not -MAX_LN_RATIO <= x_star <= MAX_LN_RATIO:  # almost flat: e^x* is no float
        side = "below" if x_star < 0 else "above"
        fit.verdict = "at_edge"
        fit.message = (
            f"the fit is almost flat: its minimum lies far {side} the explored d_model/L_b "
            f"range [{r.min():.3g}, {r.max():.3g}]: widen the space"
        )
        return fit
    fit.optimum_ratio = float(math.exp(x_star))
    fit.fitted_loss = float(a * x_star**2 + b * x_star + c)
    stars, downwards = _vertex_draws(x, y, bootstrap, seed)
    notes = []
    if bootstrap > 0 and len(y) <= 3:
        notes.append("three points fit the quadratic exactly: no interval (train more)")
    elif bootstrap > 0 and downwards > (1 - level) * bootstrap:
        notes.append(
            f"{downwards} of {bootstrap} draws of the fit have no minimum: the interval is "
            "unbounded at this level (more shapes or seeds would bound it)"
        )
    elif len(stars):
        lo, hi = np.quantile(stars, [(1 - level) / 2, 1 - (1 - level) / 2])
        if lo >= -MAX_LN_RATIO and hi <= MAX_LN_RATIO:
            fit.ci_low, fit.ci_high = float(math.exp(lo)), float(math.exp(hi))
        else:
            notes.append("the interval reaches beyond any width or depth: unbounded")
    if not x.min() <= x_star <= x.max():
        fit.verdict = "at_edge"
        side = "below" if x_star < x.min() else "above"
        notes.insert(
            0,
            f"the fitted minimum {fit.optimum_ratio:.3g} lies {side} the explored "
            f"d_model/L_b range [{r.min():.3g}, {r.max():.3g}]: widen the space",
        )
    else:
        fit.verdict = "ok"
    fit.message = "; ".join(notes)
    return fit


def shape_points(
    trials: Iterable[Any], loss_index: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Per variant, the (d_model/L_b, loss) points of the finished trials among `trials`
    (Optuna trials with the runner's `arch` attribute; the loss is value `loss_index`): what
    the scheduler's `stop` and the optimum sampler fit."""
    points: dict[str, tuple[list[float], list[float]]] = {}
    for t in trials:
        arch = t.user_attrs.get(TrialAttr.ARCH) or {}
        if t.state.name != "COMPLETE" or not t.values or not arch.get("n_layers"):
            continue
        ratios, losses = points.setdefault(arch["variant"], ([], []))
        ratios.append(arch["d_model"] / arch["n_layers"])
        losses.append(t.values[loss_index])
    return points


def located(
    points: dict[str, tuple[list[float], list[float]]], variants: Iterable[str], width: float
) -> list[OptimumFit] | None:
    """Each variant's fit when every one of `variants` has its optimum inside the explored
    shapes (`ok`) with a 90% interval at most `width` wide in ln(d_model/L_b), fitted on at
    least `LOCATED_MIN_POINTS` points; else None.
    The rule of `stop: {optimum_interval}` (`search.scheduler`), and of the benchmark that
    measures how soon a search meets it (`bench/search_efficiency.py`)."""
    fits = []
    for variant in variants:
        ratios, losses = points.get(variant, ([], []))
        if len(ratios) < LOCATED_MIN_POINTS:
            return None
        fit = fit_optimum(variant, ratios, losses)
        if fit.verdict != "ok" or fit.ci_low is None or fit.ci_high is None:
            return None
        if math.log(fit.ci_high / fit.ci_low) > width:
            return None
        fits.append(fit)
    return fits
