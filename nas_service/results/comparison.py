"""Sensitivity of the loss to each training axis (`sensitivity`), and paired comparisons
between residual variants (`compare`), both over the profile (`profiles`): seeds are paired
across variants (seed k of every trial sees the same batches and the same initialisation of
the common parameters), so variants are compared shape by shape on per-seed differences, with
a Student t interval over seeds.

Pure Python and numpy over `rows.TrialRow`s: no database, Optuna, torch or Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from nas_service.results.analysis import paired_interval
from nas_service.results.profiles import (
    ProfileRow,
    Record,
    Shape,
    _budget_order,
    profile,
    records,
)
from nas_service.results.rows import TrialRow
from nas_service.search.numbers import is_finite
from nas_service.spec import TRAINING_AXES

METHOD = "paired Student t over seeds, n-1 degrees of freedom"
#: What a pair's seeds are: held-out confirmation seeds (each setting was chosen on other
#: seeds), or the seeds that chose the setting among several (`selection`).
CONFIRMATION, SELECTION = "confirmation", "selection"


def _selection_warning(pairs: Sequence[dict[str, Any]]) -> str | None:
    """Why a verdict scored on the seeds that chose the settings is biased, where one is."""
    chosen = [
        p for p in pairs if p["scored_on"] == SELECTION and max(p["settings_chosen_from"]) > 1
    ]
    if not chosen:
        return None
    return (
        f"{len(chosen)} of {len(pairs)} pairs are scored on the seeds that chose each "
        "architecture's training setting among several: the side with more settings had more "
        "chances to look lucky, so these verdicts lean its way. Add confirm: {seeds: N} (N ≥ 2) "
        "to the spec to score each chosen setting on fresh seeds."
    )


# -- sensitivity -------------------------------------------------------------------------------


def _shape_of(row: TrialRow) -> Shape:
    _, n_layers, d_model, n_heads, budget = row.shape_key
    return (n_layers, d_model, n_heads, budget)


def _shape_dict(shape: Shape) -> dict[str, Any]:
    n_layers, d_model, n_heads, budget = shape
    return {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "budget": budget}


def _shape_order(shape: Shape) -> tuple[float, int, int, int]:
    n_layers, d_model, n_heads, budget = shape
    return (_budget_order(budget), n_layers, d_model, n_heads)


def _axes_of(recs: Sequence[Record]) -> list[str]:
    names = {k for r in recs for k in r.setting}
    return [a for a in TRAINING_AXES if a in names] + sorted(names - set(TRAINING_AXES))


def _fmt(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in sorted(set(values)))


def sensitivity(rows: Iterable[TrialRow]) -> dict[str, Any]:
    """Per variant label: the loss against each training axis that took more than one value,
    shape by shape, and where each shape's best value lies.

    A curve's point at value v of an axis is the best mean loss over the shape's records with
    that value (the other axes at their best). `at_edge` is "low" / "high" when the shape's
    best value is the smallest / largest it tried (and it tried several): the optimum may lie
    beyond the range. `best_lr` lists each shape that tried several learning rates with its
    best; with three or more such shapes, `best_lr_fit` is the least-squares fit
    ln lr* = c + a·ln d_model + b·ln n_layers over the terms the shapes identify (one
    n_layers: no b; one d_model: no a; every shape on one line ln d_model = p + q·ln n_layers,
    as at fixed parameters: only the combined slope along it, fitted as a, and the message
    says so). `flags` are messages where shapes' best values lie at an edge."""
    recs = records(rows)
    by_variant: dict[str, list[Record]] = {}
    for rec in recs:
        by_variant.setdefault(rec.row.residual, []).append(rec)
    variants = []
    for label in sorted(by_variant):
        variants.append(_variant_sensitivity(label, by_variant[label]))
    return {"variants": variants}


def _variant_sensitivity(label: str, recs: list[Record]) -> dict[str, Any]:
    shapes: dict[Shape, list[Record]] = {}
    for rec in recs:
        shapes.setdefault(_shape_of(rec.row), []).append(rec)
    axes = []
    flags = []
    best_lr: list[dict[str, Any]] = []
    for axis in _axes_of(recs):
        values = sorted({r.setting[axis] for r in recs if axis in r.setting})
        if len(values) < 2:
            continue
        curves = []
        for shape in sorted(shapes, key=_shape_order):
            best_at: dict[float, float] = {}
            for rec in shapes[shape]:
                v = rec.setting.get(axis)
                if v is not None and (v not in best_at or rec.mean < best_at[v]):
                    best_at[v] = rec.mean
            if not best_at:
                continue
            tried = sorted(best_at)
            best = min(tried, key=lambda v: (best_at[v], v))
            edge = None
            if len(tried) > 1:
                edge = "low" if best == tried[0] else "high" if best == tried[-1] else None
            curves.append(
                _shape_dict(shape)
                | {
                    "points": [[v, best_at[v]] for v in tried],
                    "best": best,
                    "at_edge": edge,
                    "tried": len(tried),
                }
            )
            if axis == "lr" and len(tried) > 1:
                best_lr.append(_shape_dict(shape) | {"best_lr": best})
        axes.append({"axis": axis, "values": values, "curves": curves})
        flags += _edge_flags(axis, curves)
    return {
        "variant": label,
        "axes": axes,
        "best_lr": best_lr,
        "best_lr_fit": _lr_fit(best_lr) if len(best_lr) >= 3 else None,
        "flags": flags,
    }


def _edge_flags(axis: str, curves: list[dict[str, Any]]) -> list[str]:
    several = [c for c in curves if c["tried"] > 1]
    out = []
    for edge, word in (("high", "largest"), ("low", "smallest")):
        at = [c for c in several if c["at_edge"] == edge]
        if at:
            out.append(
                f"widen {axis}: the best {axis} of {len(at)} of {len(several)} shapes lies at "
                f"the {word} value tried ({_fmt(c['best'] for c in at)})"
            )
    return out


#: Above this R² of ln d_model on ln n_layers the two are fitted as one term: at a fixed
#: parameter count they move together up to the rounding of the width, and a two-term fit
#: would return large exponents of opposite sign that mean nothing.
COLLINEAR_R2 = 0.95


def _lr_fit(best_lr: list[dict[str, Any]]) -> dict[str, Any]:
    """ln lr* = c + a·ln d_model + b·ln n_layers by least squares over the identifiable
    terms (see `sensitivity`); `rms_residual` where there are more shapes than terms."""
    y = np.log([float(b["best_lr"]) for b in best_lr])
    ln_d = np.log([float(b["d_model"]) for b in best_lr])
    ln_l = np.log([float(b["n_layers"]) for b in best_lr])
    n = len(y)
    varies_d, varies_l = np.ptp(ln_d) > 1e-12, np.ptp(ln_l) > 1e-12
    message = ""
    terms: list[tuple[str, np.ndarray]] = []
    if varies_d and varies_l:
        line = np.polyfit(ln_l, ln_d, 1)
        r2 = 1 - np.sum((np.polyval(line, ln_l) - ln_d) ** 2) / np.sum((ln_d - ln_d.mean()) ** 2)
        if r2 > COLLINEAR_R2:  # a fixed-parameter sweep: d_model falls as n_layers grows
            message = (
                f"d_model ∝ n_layers^{line[0]:.3g} across the shapes (R² {r2:.3f}): the "
                "exponents of d_model and n_layers are not separately identifiable; a is "
                "their combined slope along that line (fitted on ln d_model alone)"
            )
            terms = [("a", ln_d)]
        else:
            terms = [("a", ln_d), ("b", ln_l)]
    elif varies_d:
        terms, message = [("a", ln_d)], "one n_layers: fitted on ln d_model alone"
    elif varies_l:
        terms, message = [("b", ln_l)], "one d_model: fitted on ln n_layers alone"
    else:
        message = "every shape has the same d_model and n_layers: only c is fitted"
    X = np.stack([np.ones(n)] + [col for _, col in terms], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    fitted = {name: float(coef[i + 1]) for i, (name, _) in enumerate(terms)}
    dof = n - X.shape[1]
    rms = float(np.sqrt(np.sum((y - X @ coef) ** 2) / dof)) if dof > 0 else None
    return {
        "formula": "ln lr* = c + a ln d_model + b ln n_layers",
        "c": float(coef[0]),
        "a": fitted.get("a"),
        "b": fitted.get("b"),
        "n_shapes": n,
        "rms_residual": rms,
        "message": message,
    }


# -- paired comparisons --------------------------------------------------------------------


def _verdict(n: int, low: float | None, high: float | None) -> str:
    if n < 2 or low is None or high is None:
        return "undetermined"
    if high < 0:
        return "better"
    if low > 0:
        return "worse"
    return "no_difference"


def _interval(diffs: list[float], level: float) -> tuple[float | None, float | None, float | None]:
    if len(diffs) >= 2:
        return paired_interval(diffs, level)
    return (diffs[0] if diffs else None), None, None


def _resolve(reference: str, labels: Sequence[str]) -> str:
    """`reference` as a variant label of the job: itself, or a bare variant name that only
    one label has (`block_attnres` when the job has `block_attnres/S=4` alone)."""
    if reference in labels:
        return reference
    bare = [lab for lab in labels if lab.split("/")[0] == reference]
    if len(bare) == 1:
        return bare[0]
    known = ", ".join(labels) or "none"
    if len(bare) > 1:
        raise ValueError(f"reference {reference!r} is ambiguous: name one of {', '.join(bare)}")
    raise ValueError(
        f"reference {reference!r} has no trained trial in this job (variants trained: {known})"
    )


def compare(
    rows: Iterable[TrialRow],
    reference: str = "baseline",
    level: float = 0.95,
    profiled: Sequence[ProfileRow] | None = None,
) -> dict[str, Any]:
    """Every variant label against `reference`, shape by shape (same n_layers, d_model,
    n_heads, budget), each architecture at its profiled best setting.

    A pair's differences are variant − reference per seed index, over the seeds both have
    (a loss lower than the reference's is negative); their mean and the `level` Student t
    interval d̄ ± t_((1+level)/2, n−1)·s/√n (`analysis.paired_interval`); the verdict
    `better` when the interval lies below 0, `worse` above, `no_difference` when it holds 0,
    `undetermined` under two paired seeds. Against depth (per variant and budget): at each
    n_layers the differences of every matched shape there pooled, with the same interval;
    `crossover_depth` is the smallest n_layers from which the variant is `better` at that
    and every larger explored depth (None, with a message, when the deepest is not).
    `profiled`: `profile(rows)` where the caller has it already.
    Raises ValueError when the reference has no trained trial."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    prof = profile(rows) if profiled is None else profiled
    labels = sorted({p.residual for p in prof})
    ref = _resolve(reference, labels)
    best: dict[str, dict[Shape, ProfileRow]] = {}
    for p in prof:  # one architecture per shape and label: the best, should several exist
        held = best.setdefault(p.residual, {})
        if p.shape not in held or p.loss < held[p.shape].loss:
            held[p.shape] = p
    refs = best[ref]
    pairs: list[dict[str, Any]] = []
    unmatched: list[dict[str, Any]] = []
    matched: set[Shape] = set()
    for label in labels:
        if label == ref:
            continue
        for shape in sorted(best[label], key=_shape_order):
            p = best[label][shape]
            r = refs.get(shape)
            if r is None:
                unmatched.append(
                    {"variant": label} | _shape_dict(shape) | {"reason": f"no {ref} trial"}
                )
                continue
            matched.add(shape)
            pairs.append(_pair(label, shape, p, r, level))
    for shape in sorted(set(refs) - matched, key=_shape_order):
        unmatched.append(
            {"variant": ref} | _shape_dict(shape) | {"reason": "no other variant at this shape"}
        )
    scored = {pair["scored_on"] for pair in pairs}
    return {
        "reference": ref,
        "level": level,
        "method": METHOD,
        "scored_on": scored.pop() if len(scored) == 1 else "mixed" if scored else None,
        "warning": _selection_warning(pairs),
        "pairs": pairs,
        "crossover": _crossovers(pairs, ref, level),
        "unmatched": unmatched,
    }


def _pair(label: str, shape: Shape, p: ProfileRow, r: ProfileRow, level: float) -> dict[str, Any]:
    """The pair's differences over the seeds both scored (by seed number: a confirmation
    seed pairs only with the same confirmation seed, never with a tuning seed)."""
    ours = dict(zip(p.seed_ids, p.seeds, strict=True))
    theirs = dict(zip(r.seed_ids, r.seeds, strict=True))
    seeds = [k for k in sorted(ours.keys() & theirs.keys()) if is_finite(ours[k])]
    seeds = [k for k in seeds if is_finite(theirs[k])]
    diffs = [float(ours[k]) - float(theirs[k]) for k in seeds]  # type: ignore[arg-type]
    mean, low, high = _interval(diffs, level)
    return (
        {"variant": label}
        | _shape_dict(shape)
        | {
            "sublayers": 2 * shape[0],
            "seeds": seeds,
            "differences": diffs,
            "mean": mean,
            "ci_low": low,
            "ci_high": high,
            "verdict": _verdict(len(diffs), low, high),
            "scored_on": CONFIRMATION if p.confirmed and r.confirmed else SELECTION,
            "settings_chosen_from": [p.n_settings, r.n_settings],
            "trial": p.row.number,
            "reference_trial": r.row.number,
            "setting": p.setting,
            "reference_setting": r.setting,
        }
    )


def _crossovers(pairs: list[dict[str, Any]], ref: str, level: float) -> list[dict[str, Any]]:
    groups: dict[tuple[str, float | None], dict[int, list[float]]] = {}
    for pair in pairs:
        depths = groups.setdefault((pair["variant"], pair["budget"]), {})
        depths.setdefault(pair["n_layers"], []).extend(pair["differences"])
    out = []
    for (label, budget), depths in sorted(
        groups.items(), key=lambda kv: (kv[0][0], _budget_order(kv[0][1]))
    ):
        by_depth: list[dict[str, Any]] = []
        for n_layers in sorted(depths):
            diffs = depths[n_layers]
            mean, low, high = _interval(diffs, level)
            by_depth.append(
                {
                    "n_layers": n_layers,
                    "sublayers": 2 * n_layers,
                    "n": len(diffs),
                    "mean": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "verdict": _verdict(len(diffs), low, high),
                }
            )
        crossover: int | None = None
        for point in reversed(by_depth):
            if point["verdict"] != "better":
                break
            crossover = int(point["n_layers"])
        out.append(
            {
                "variant": label,
                "budget": budget,
                "crossover_depth": crossover,
                "crossover_sublayers": None if crossover is None else 2 * crossover,
                "by_depth": by_depth,
                "message": _crossover_message(label, ref, by_depth, crossover, level),
            }
        )
    return out


def _crossover_message(
    label: str, ref: str, by_depth: list[dict[str, Any]], crossover: int | None, level: float
) -> str:
    lo, hi = by_depth[0]["n_layers"], by_depth[-1]["n_layers"]
    explored = f"the explored range [{lo}, {hi}] n_layers ({2 * lo}-{2 * hi} sublayers)"
    if crossover is None:
        return (
            f"no crossover found in {explored}: {label} is not reliably better than {ref} "
            f"at the deepest explored depth, n_layers {hi} ({by_depth[-1]['verdict']} at "
            f"{level:.0%})"
        )
    if crossover == lo:
        return (
            f"{label} is reliably better than {ref} at every depth of {explored} "
            f"({level:.0%} intervals); a crossover, if any, lies below n_layers {lo}"
        )
    below = next(p for p in reversed(by_depth) if p["n_layers"] < crossover)
    return (
        f"crossover at n_layers {crossover} ({2 * crossover} sublayers): from there to the "
        f"deepest explored ({hi}) {label} is reliably better than {ref} ({level:.0%} "
        f"intervals); at n_layers {below['n_layers']}: {below['verdict']}"
    )
