"""Answers that are statistics, not dumps: Pareto fronts over any metrics, the loss-optimal
d_model/L_b per residual variant with a bootstrap interval, scaling-law fits, and the plots.

Pure numpy (matplotlib only for the plots, imported when one is drawn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

#: What the fits and plots take for a column of numbers: a sequence or a 1-D array (each is
#: read with np.asarray).
Floats = Sequence[float] | np.ndarray

# -- Pareto fronts ------------------------------------------------------------------------------


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of `points` (n, m), every column minimised.

    A row is dominated when another is at least as good in every column and better in one;
    exact duplicates do not dominate each other (both stay). Two columns: one sort,
    O(n log n). More: rows sorted lexicographically, each checked only against the front so
    far (a row can only be dominated by rows before it in that order)."""
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2:
        raise ValueError("points must be a 2-D array (n, m)")
    n, m = pts.shape
    if n == 0:
        return np.zeros(0, dtype=int)
    if m == 1:
        return np.flatnonzero(pts[:, 0] == pts[:, 0].min())
    order = np.lexsort(pts.T[::-1])  # by column 0, then 1, …
    if m == 2:
        return np.sort(_front_2d(pts, order))
    front: list[int] = []
    for i in order:
        if front:
            f = pts[front]
            dominated = np.all(f <= pts[i], axis=1) & np.any(f < pts[i], axis=1)
            if dominated.any():
                continue
        front.append(int(i))
    return np.sort(np.asarray(front, dtype=int))


def _front_2d(pts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Sweep in (x, y) order: a row is on the front when its y is below every y seen at a
    smaller x, or equals the best y among rows with the very same (x, y)."""
    keep = []
    best_y = math.inf  # best y among strictly smaller x (or same x, smaller y)
    prev: tuple[float, float] | None = None
    prev_kept = False
    for i in order:
        x, y = pts[i]
        if prev is not None and (x, y) == prev:
            if prev_kept:
                keep.append(int(i))  # a duplicate of a front point
            continue
        on = y < best_y
        if on:
            keep.append(int(i))
        best_y = min(best_y, y)
        prev, prev_kept = (x, y), on
    return np.asarray(keep, dtype=int)


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True)
    )


# -- the loss-optimal shape ----------------------------------------------------------------------


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


def _bootstrap_vertices(x: np.ndarray, y: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Vertices −b/2a of the quadratic refitted on `resamples` bootstrap resamples of the
    trials, all at once: a resample is a vector of counts w, and its least-squares fit solves
    (Xᵀ diag(w) X) β = Xᵀ diag(w) y with X = [x², x, 1]. Resamples with fewer than three
    distinct shapes or a fit opening downwards are dropped."""
    if resamples <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    n = len(x)
    counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(resamples)])
    X = np.stack([x**2, x, np.ones_like(x)], axis=1)  # (n, 3)
    shapes = np.unique(np.round(x, 9), return_inverse=True)[1]
    distinct = np.array([len(np.unique(shapes[c > 0])) for c in counts])
    XtWX = np.einsum("bn,ni,nj->bij", counts, X, X)
    XtWy = np.einsum("bn,ni,n->bi", counts, X, y)
    ok = distinct >= 3
    beta = np.linalg.solve(XtWX[ok], XtWy[ok][..., None])[..., 0]  # (b, 3): a, b, c
    a, b = beta[:, 0], beta[:, 1]
    vertices: np.ndarray = -b[a > 0] / (2 * a[a > 0])
    return vertices


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
    block): a quadratic fit of loss against ln(ratio); a percentile bootstrap (resampling the
    trials) gives the interval. Verdicts: `too_few_shapes` under three distinct ratios;
    `no_minimum` when the fit opens downwards; `at_edge` when the vertex lies outside the
    explored ratios (the data cannot locate a minimum: widen the space)."""
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
    fit.optimum_ratio = float(math.exp(x_star))
    fit.fitted_loss = float(a * x_star**2 + b * x_star + c)
    stars = _bootstrap_vertices(x, y, bootstrap, seed)
    if len(stars):
        lo, hi = np.quantile(stars, [(1 - level) / 2, 1 - (1 - level) / 2])
        fit.ci_low, fit.ci_high = float(math.exp(lo)), float(math.exp(hi))
    if not x.min() <= x_star <= x.max():
        fit.verdict = "at_edge"
        side = "below" if x_star < x.min() else "above"
        fit.message = (
            f"the fitted minimum {fit.optimum_ratio:.3g} lies {side} the explored "
            f"d_model/L_b range [{r.min():.3g}, {r.max():.3g}]: widen the space"
        )
    else:
        fit.verdict = "ok"
    return fit


# -- scaling laws ---------------------------------------------------------------------------------


@dataclass
class ScalingFit:
    """ℒ = A·C^−α fitted in log-log space (C in FLOPs, or PF-days when asked)."""

    variant: str
    A: float
    alpha: float
    points: list[tuple[float, float]]
    residuals: list[float]

    @overload
    def loss_at(self, compute: float) -> float: ...
    @overload
    def loss_at(self, compute: np.ndarray) -> np.ndarray: ...
    def loss_at(self, compute: float | np.ndarray) -> float | np.ndarray:
        loss: float | np.ndarray = self.A * compute ** (-self.alpha)  # arrays too (vectorised)
        return loss

    def compute_for(self, loss: float) -> float:
        return float((self.A / loss) ** (1 / self.alpha))

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "A": self.A,
            "alpha": self.alpha,
            "points": self.points,
            "residuals": self.residuals,
        }


def fit_scaling(variant: str, compute: Floats, loss: Floats) -> ScalingFit:
    c = np.asarray(compute, dtype=float)
    y = np.asarray(loss, dtype=float)
    if len(np.unique(c)) < 2:
        raise ValueError(f"{variant}: a scaling fit needs at least two budgets")
    slope, intercept = np.polyfit(np.log(c), np.log(y), 1)
    pred = intercept + slope * np.log(c)
    return ScalingFit(
        variant,
        float(math.exp(intercept)),
        float(-slope),
        [(float(a), float(b)) for a, b in zip(c, y, strict=True)],
        [float(v) for v in np.log(y) - pred],
    )


def compute_multiplier(target: ScalingFit, reference: ScalingFit, loss: float) -> float:
    """How much more compute `reference` needs than `target` to reach `loss` (the paper:
    Block AttnRes at 5.6 PF-days matches a baseline with ≈ 1.25× the compute)."""
    return reference.compute_for(loss) / target.compute_for(loss)


# -- plots ---------------------------------------------------------------------------------


def plot_pareto(
    x: Floats,
    y: Floats,
    front: Sequence[int] | np.ndarray,
    labels: Sequence[str],
    x_name: str,
    y_name: str,
    path: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    for label in sorted(set(labels)):
        mask = np.asarray([lab == label for lab in labels])
        ax.scatter(xs[mask], ys[mask], s=22, alpha=0.6, label=label)
    f = np.asarray(sorted(front, key=lambda i: (xs[i], ys[i])), dtype=int)
    if len(f):
        ax.step(xs[f], ys[f], where="post", color="black", lw=1.2, label="Pareto front")
        ax.scatter(xs[f], ys[f], s=60, facecolors="none", edgecolors="black")
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    if xs.size and xs.min() > 0 and xs.max() / max(xs.min(), 1e-300) > 50:
        ax.set_xscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"{y_name} versus {x_name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_optimum(
    data: dict[str, tuple[Floats, Floats]],
    fits: dict[str, OptimumFit],
    path: str,
) -> None:
    """Loss versus d_model/L_b per variant, the fitted curves and their optima (the pictures
    of the paper's Figure 7, from a user's own job)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, (variant, (ratios, losses)) in enumerate(sorted(data.items())):
        color = f"C{i}"
        ax.scatter(ratios, losses, color=color, s=22, alpha=0.7, label=variant)
        fit = fits.get(variant)
        if fit and fit.coefficients and len(ratios):
            a, b, c = fit.coefficients
            grid = np.linspace(np.log(min(ratios)), np.log(max(ratios)), 100)
            ax.plot(np.exp(grid), a * grid**2 + b * grid + c, color=color, lw=1.2)
            if fit.optimum_ratio and fit.fitted_loss is not None and fit.verdict == "ok":
                ax.axvline(fit.optimum_ratio, color=color, ls="--", lw=0.8)
                ax.annotate(
                    f"{fit.optimum_ratio:.0f}",
                    (fit.optimum_ratio, fit.fitted_loss),
                    color=color,
                    fontsize=8,
                )
    ax.set_xscale("log")
    ax.set_xlabel("d_model / L_b")
    ax.set_ylabel("validation loss")
    ax.set_title("loss versus shape at matched compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
