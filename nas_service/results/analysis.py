"""Answers that are statistics, not dumps: Pareto fronts over any metrics, the loss-optimal
d_model/L_b per residual variant with its interval, scaling-law fits, paired Student t
intervals (the t quantile in closed form, no scipy), and the plots.

Pure numpy (matplotlib only for the plots, imported when one is drawn).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from nas_service.search.dominance import dominance
from nas_service.search.dominance import dominates as dominates
from nas_service.search.optimum import OptimumFit as OptimumFit
from nas_service.search.optimum import fit_optimum as fit_optimum

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
            if dominance(f, pts[i][None, :]).any():
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


# -- paired comparisons ---------------------------------------------------------------------


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with an integer number of degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3 for odd ν, 26.7.4 for even ν), with θ = arctan(t/√ν):

    A(t|ν) = P(|T| ≤ |t|) = 2θ/π + (2/π) sinθ (cosθ + ⅔cos³θ + … + (2·4·…(ν−3))/(1·3·…(ν−2))
    cos^(ν−2)θ) for odd ν (the sum empty for ν = 1), and sinθ (1 + ½cos²θ + (1·3)/(2·4)cos⁴θ
    + … + (1·3·…(ν−3))/(2·4·…(ν−2)) cos^(ν−2)θ) for even ν; P(T ≤ t) = (1 ± A)/2."""
    nu = _dof(df)
    theta = math.atan(abs(t) / math.sqrt(nu))
    a = _abs_mass(theta, nu)
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def _dof(df: int | float) -> int:
    nu = int(df)
    if nu != df or nu < 1:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df}")
    return nu


def _abs_mass(theta: float, nu: int) -> float:
    """A(t|ν) of A&S 26.7.3–4 at θ = arctan(t/√ν); the series' terms by their ratios,
    term_k = term_(k−1) · cos²θ · (2k − 1)/(2k) (even ν) or · 2k/(2k + 1) (odd ν)."""
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if nu % 2 == 0:
        k = np.arange(1, nu // 2)
        terms = np.cumprod(c2 * (2 * k - 1) / (2 * k))
        return min(1.0, s * (1.0 + float(terms.sum())))
    series = 0.0
    if nu > 1:
        k = np.arange(1, (nu - 1) // 2)
        terms = math.cos(theta) * np.concatenate(([1.0], np.cumprod(c2 * 2 * k / (2 * k + 1))))
        series = s * float(terms.sum())
    return min(1.0, 2 / math.pi * (theta + series))


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer `df`: `t_cdf` inverted by bisection on
    θ = arctan(t/√ν) ∈ [0, π/2), where A(t|ν) rises from 0 to 1 (exact to rounding: the
    bisection runs until the bracket stops shrinking)."""
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    nu = _dof(df)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, nu)
    target = 2 * p - 1  # A(t|ν) = P(|T| ≤ t)
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _abs_mass(mid, nu) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(nu) * math.tan(0.5 * (lo + hi))


def paired_interval(differences: Floats, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of paired differences d₁…dₙ: the Student t interval
    d̄ ± t_((1+level)/2, n−1) · s/√n, s the sample standard deviation (n − 1 in its
    denominator). Exact when the differences are independent and normal; needs n ≥ 2."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or len(d) < 2 or not np.all(np.isfinite(d)):
        raise ValueError("a paired interval needs at least two finite differences")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n = len(d)
    mean = float(d.mean())
    half = t_quantile((1 + level) / 2, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


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


def _ratio_ticks(ax: Any, ratios: Sequence[float]) -> None:
    """Ticks of a log axis of shapes at the shapes explored (at most 12), written as plain
    numbers: the default decade ticks of a range under two decades are unreadable."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    shown = sorted({float(f"{r:.3g}") for r in ratios if r > 0})
    if not shown or len(shown) > 12:
        return
    ax.xaxis.set_major_locator(FixedLocator(shown))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


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
    _ratio_ticks(ax, [r for ratios, _ in data.values() for r in np.asarray(ratios, float)])
    ax.set_xlabel("d_model / L_b")
    ax.set_ylabel("validation loss")
    ax.set_title("loss versus shape at matched compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_compare(answer: Mapping[str, Any], path: str) -> None:
    """The paired difference (variant − reference, in validation loss) against depth in
    sublayers, one series per variant (and budget, where several) of a comparison answer
    (`nas_service.results.comparison.compare`), each depth's interval as an error bar, a line
    at zero (below it: the variant's loss is lower) and the crossover depth dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.axhline(0.0, color="black", lw=0.8)
    entries = list(answer.get("crossover", []))
    several = len({e.get("budget") for e in entries}) > 1
    for i, entry in enumerate(entries):
        points = [p for p in entry["by_depth"] if p["mean"] is not None]
        if not points:
            continue
        color = f"C{i % 10}"
        depth = np.array([2 * p["n_layers"] for p in points], dtype=float)
        mean = np.array([p["mean"] for p in points], dtype=float)
        low = np.array([p["mean"] if p["ci_low"] is None else p["ci_low"] for p in points])
        high = np.array([p["mean"] if p["ci_high"] is None else p["ci_high"] for p in points])
        label = str(entry["variant"])
        if several and entry.get("budget") is not None:
            label += f" @ {entry['budget']:.3g}"
        ax.errorbar(
            depth,
            mean,
            yerr=np.stack([mean - low, high - mean]),
            color=color,
            marker="o",
            ms=4,
            capsize=3,
            lw=1.2,
            label=label,
        )
        if entry.get("crossover_sublayers") is not None:
            ax.axvline(entry["crossover_sublayers"], color=color, ls="--", lw=0.8)
    level = float(answer.get("level", 0.95))
    ax.set_xlabel("depth (sublayers, 2·n_layers)")
    ax.set_ylabel(f"Δ validation loss (variant − {answer.get('reference', 'reference')})")
    ax.set_title(f"paired difference against depth ({level:.0%} intervals)")
    if entries:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
