"""The answers over a job's results table (`cache.JobResults`): the Pareto front over any
metrics, the loss-optimal shape per residual variant (and whether it moves with the training
setting) and the scaling law per variant. The table, its cache and its rows' decoding live in
`cache` and `decode`; their names are re-exported here, where callers have imported them."""

from __future__ import annotations

from typing import Any

import numpy as np

from nas_service.results import profiles
from nas_service.results.analysis import (
    OptimumFit,
    compute_multiplier,
    fit_optimum,
    fit_scaling,
    pareto_front,
)
from nas_service.results.cache import JobResults as JobResults
from nas_service.results.cache import ResultsCache as ResultsCache
from nas_service.results.cache import approx_bytes as approx_bytes
from nas_service.results.cache import job_results as job_results
from nas_service.results.cache import table_bytes as table_bytes
from nas_service.results.decode import _row as _row
from nas_service.results.rows import SettingKey as SettingKey
from nas_service.results.rows import TrialRow as TrialRow
from nas_service.results.rows import setting_key as setting_key
from nas_service.search.numbers import is_finite


def pareto_rows(
    results: JobResults, metrics: list[str], variant: str | None = None, profile: bool = False
) -> tuple[list[TrialRow], list[TrialRow]]:
    """(front, candidates): the non-dominated rows over `metrics` (each minimised) among the
    rows that have every metric (trained trials for val_loss), optionally one variant. With
    `profile`, each trained architecture is its best-setting trial alone (`profiles.profile`);
    trials of architectures with no completed training (infeasible, pruned) stay as they are."""
    rows = results.counted()
    if profile:
        best = results.profile()
        chosen = {id(p.row) for p in best}
        profiled = {p.arch_key for p in best}
        rows = [r for r in rows if id(r) in chosen or r.arch_key not in profiled]
    rows = [
        r
        for r in rows
        if all(m in r.metrics and is_finite(r.metrics[m]) for m in metrics)
        and (variant is None or r.variant == variant)
    ]
    if not rows:
        return [], []
    points = np.array([[r.metrics[m] for m in metrics] for r in rows], dtype=float)
    front = pareto_front(points)
    return [rows[i] for i in front], rows


def _ratio(row: TrialRow) -> float:
    return float(row.arch["d_model"]) / float(row.arch["n_layers"])


def _points(
    results: JobResults, rows: list[TrialRow], profile: bool
) -> list[tuple[TrialRow, float, dict[str, float]]]:
    """(trial, loss, setting) per point of a fit of `rows` (trials of whole architectures:
    all of an architecture's trials or none): one per architecture at its best setting
    (the job's profile, filtered), or every trained trial at its own."""
    if profile:
        archs = {r.arch_key for r in rows}
        return [(p.row, p.loss, p.setting) for p in results.profile() if p.arch_key in archs]
    return [
        (r, r.metrics["val_loss"], r.setting) for r in rows if is_finite(r.metrics.get("val_loss"))
    ]


def optimum_by_variant(
    results: JobResults, bootstrap: int = 200, profile: bool = True
) -> list[dict[str, Any]]:
    """Per residual variant (and per budget, for jobs over several): the loss-optimal
    d_model/L_b among trained trials at matched compute (`analysis.fit_optimum`), fitted on
    the profile (one point per architecture: its best training setting's mean loss) or, with
    `profile` off, on every trained trial (`view`).

    Where the variant was trained at more than one setting, `fixed` is the same fit on
    `profiles.fixed_view` of the variant's trials at that budget (every shape at the one
    setting that is best for the variant as a whole, as if the job had fixed it), and `moved` says
    whether the optimum moves between the two: the fit's optimum lies outside the fixed
    view's interval (or, without one, the fixed optimum outside the fit's), or the verdicts
    differ; `move_message` says which way and by what factor."""
    groups: dict[tuple[str, float | None], list[TrialRow]] = {}
    for r in results.counted():
        if r.state == "complete" and r.arch and "d_model" in r.arch and r.arch.get("n_layers"):
            groups.setdefault((r.variant, r.budget), []).append(r)
    out = []
    for (variant, budget), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        points = _points(results, rows, profile)
        if not points:
            continue
        ratios = [_ratio(r) for r, _, _ in points]
        losses = [loss for _, loss, _ in points]
        best, best_loss, best_setting = min(points, key=lambda p: (p[1], p[0].number))
        fit = fit_optimum(
            variant,
            ratios,
            losses,
            bootstrap=bootstrap,
            best_observed={
                "trial": best.number,
                "val_loss": best_loss,
                "d_model": best.arch["d_model"],
                "n_layers": best.arch["n_layers"],
                "ratio": _ratio(best),
                "setting": best_setting,
            },
        )
        edge = _one_block_edge(fit, points)
        if edge:  # no wider shape exists: say what would locate it instead
            fit.message = f"{fit.message.replace(': widen the space', '')} {edge}".strip()
        answer = fit.as_dict() | {
            "budget": budget,
            "view": "profile" if profile else "raw",
            "_fit": fit,
            "_data": (ratios, losses),
        }
        tried = profiles.records(rows)
        if len({p.setting_key for p in tried}) > 1:
            setting, fixed_rows = profiles.fixed_view(rows)
            varied = {k for k in setting if len({r.setting.get(k) for r in tried}) > 1}
            fixed = fit_optimum(
                variant, [p.ratio for p in fixed_rows], [p.loss for p in fixed_rows], bootstrap
            )
            answer["fixed"] = {
                "setting": setting,
                "optimum_ratio": fixed.optimum_ratio,
                "ci_low": fixed.ci_low,
                "ci_high": fixed.ci_high,
                "verdict": fixed.verdict,
                "n_shapes": fixed.n_shapes,
                "message": fixed.message,
            }
            shown = {k: v for k, v in setting.items() if k in varied} or setting
            answer["moved"], answer["move_message"] = _moved(fit, fixed, shown, profile)
        out.append(answer)
    return out


def _one_block_edge(fit: OptimumFit, points: list[tuple[TrialRow, float, Any]]) -> str:
    """Where the fitted minimum lies beyond the widest shape and that shape has one block
    already, widening the space at this parameter count is impossible: say so, and what
    would locate the optimum."""
    if fit.verdict != "at_edge" or fit.optimum_ratio is None or fit.explored is None:
        return ""
    widest = max(points, key=lambda p: _ratio(p[0]))[0]
    if fit.optimum_ratio <= fit.explored[1] or widest.arch.get("n_layers") != 1:
        return ""
    return (
        f"The widest shape explored already has one block (L_b = 1, d_model = "
        f"{widest.arch['d_model']}): at this parameter count no shape is wider, so the data "
        "say only that the shallowest shape is best here. Locating the optimum needs a larger "
        "parameter target (at one block, d_model/L_b grows as the square root of the "
        "parameters) or a longer budget per candidate."
    )


def _moved(
    fit: OptimumFit, fixed: OptimumFit, setting: dict[str, float], profile: bool
) -> tuple[bool, str]:
    """Whether the optimum moves between the fixed-setting view and `fit`, and a sentence."""
    shared = ", ".join(f"{k}={v:.3g}" for k, v in sorted(setting.items())) or "one setting"
    fixed_says = f"every shape at {shared}"
    fit_says = "each architecture at its best setting" if profile else "every trial"
    opt, ref = fit.optimum_ratio, fixed.optimum_ratio
    if fit.verdict != fixed.verdict:
        where = f" (from {ref:.3g} to {opt:.3g})" if opt is not None and ref is not None else ""
        return True, (
            f"the optimum's verdict moves from {fixed.verdict} ({fixed_says}) to "
            f"{fit.verdict} ({fit_says}){where}"
        )
    if opt is None or ref is None:
        return False, f"neither view locates an optimum ({fit.verdict})"
    factor = opt / ref
    way = f"{factor:.3g}× larger" if factor >= 1 else f"{1 / factor:.3g}× smaller"
    if fixed.ci_low is not None and fixed.ci_high is not None:
        outside = not fixed.ci_low <= opt <= fixed.ci_high
        against = f"the fixed view's interval [{fixed.ci_low:.3g}, {fixed.ci_high:.3g}]"
    elif fit.ci_low is not None and fit.ci_high is not None:
        outside = not fit.ci_low <= ref <= fit.ci_high
        against = f"the interval [{fit.ci_low:.3g}, {fit.ci_high:.3g}] (the fixed view has none)"
    else:
        return False, (
            f"no interval to tell: the optimum is {ref:.3g} with {fixed_says} and {opt:.3g} "
            f"with {fit_says}"
        )
    if outside:
        return True, (
            f"the optimum moves from {ref:.3g} ({fixed_says}) to {opt:.3g} ({fit_says}): "
            f"{way}, outside {against}"
        )
    return False, (
        f"the optimum does not move: {opt:.3g} ({fit_says}) against {ref:.3g} ({fixed_says}), "
        f"within {against}"
    )


def scaling_by_variant(
    results: JobResults,
    reference: str | None = None,
    loss: float | None = None,
    profile: bool = True,
) -> dict[str, Any]:
    """ℒ = A·C^−α per variant from the best loss at each budget (over the profile: each
    architecture at its best setting; the best per budget is the same over the raw trials),
    and the compute multiplier of every variant over `reference` at `loss` (how much more
    compute the reference needs)."""
    best: dict[str, dict[float, float]] = {}
    trained = [r for r in results.counted() if r.state == "complete" and r.budget]
    for r, value, _ in _points(results, trained, profile):
        if r.budget:
            per = best.setdefault(r.variant, {})
            if r.budget not in per or value < per[r.budget]:
                per[r.budget] = value
    fits = {}
    problems = {}
    for variant, pts in sorted(best.items()):
        try:
            fits[variant] = fit_scaling(variant, list(pts), list(pts.values()))
        except ValueError as exc:
            problems[variant] = str(exc)
    out: dict[str, Any] = {"fits": {v: f.as_dict() for v, f in fits.items()}, "problems": problems}
    if reference is not None and loss is not None:
        if reference not in fits:
            problems[reference] = "no scaling fit for the reference variant"
        else:
            out["reference"], out["loss"] = reference, loss
            out["multipliers"] = {
                v: compute_multiplier(f, fits[reference], loss)
                for v, f in fits.items()
                if v != reference
            }
    return out
