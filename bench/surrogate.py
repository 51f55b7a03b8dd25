"""A surrogate landscape: a model fitted to the recorded runs, sampled densely enough that
search strategies can be told apart, written in the landscape format so that the simulated
backend and `bench/search_efficiency.py` replay it like a recorded one.

    python bench/surrogate.py [--recorded bench/landscapes/crossover_wsd.json]
        [--noise-from bench/landscapes/crossover.json] [--depths 2 3 4 ...] [--lrs ...]
        [--dlms ...] [--seeds 5] [--out bench/landscapes/surrogate.json] [--json FILE]

The model, per residual variant v, of a run's final validation loss, in x = ln(d_model/L)
(L the number of layers), u = ln(lr) and w = ln(depth_lr_mult) (for the depth-mixing
variants only; the standard residual ignores it):

    loss = a_v + b_v x + c_v x² + p_v u + q_v u² + r_v x u [+ s_v w + t_v w²] + σ ε_seed

fitted by least squares to every finished run of the recorded landscape (`--recorded`, one
seed per point). σ is the pooled seed-to-seed standard deviation of the landscape that holds
several seeds per point (`--noise-from`), ε a standard normal draw per (point, seed). Each
generated run carries a curve: the variant's mean recorded curve shape (loss over final loss
at each fraction of the run), scaled to the run's final loss, so rungs read a loss part-way.
The architecture, the cost metrics and the step count of each point are what the service
itself computes for the generated spec (`nas_service.spec.enumerate_candidates`,
`nas_service.search.pricing.price_candidate`), so a replayed run is answered exactly.

Checked against the recorded runs: the RMSE of a k-fold cross-validation (each recorded
point predicted by a model fitted without it) beside σ and the fit's own residual; a model
no better than the seed noise is as close as a model can get.

The generator's parameters (the coefficients, σ, curve shapes, grid, seed) are written into
the landscape (`job.spec.name` says what it is, `generator` holds them), and the true mean
of every point is the model's noise-free value: the benchmark's "true mean loss" of a point
is the mean of its generated seeds, which converges to it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LANDSCAPES = Path(__file__).resolve().parent / "landscapes"
RECORDED = LANDSCAPES / "crossover_wsd.json"
NOISE_FROM = LANDSCAPES / "crossover.json"
OUT = LANDSCAPES / "surrogate.json"
DEPTHS = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
LRS = tuple(round(0.002 * 2 ** (k / 3), 6) for k in range(7))  # 0.002 … 0.008
DLMS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
FRACTIONS = tuple((k + 1) / 9 for k in range(9))  # where a generated curve is evaluated
MIXED = ("block_attnres", "full_attnres")


@dataclass(frozen=True)
class Run:
    """One recorded run: where it sits in the model's inputs, and what it measured."""

    variant: str
    x: float
    u: float
    w: float
    loss: float
    curve: tuple[tuple[float, float], ...]  # (fraction of the run, loss / final loss)
    point: tuple[int, float, float]  # (trial number, lr, depth_lr_mult)


def features(variant: str, x: float, u: float, w: float) -> list[float]:
    """The model's regressors (see the module)."""
    base = [1.0, x, x * x, u, u * u, x * u]
    return base + ([w, w * w] if variant in MIXED else [])


@dataclass
class Model:
    """The fitted surrogate (see the module)."""

    coef: dict[str, list[float]]
    sigma: float
    shapes: dict[str, list[float]]  # loss / final at FRACTIONS, per variant
    residual_rmse: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def mean(self, variant: str, x: float, u: float, w: float) -> float:
        return float(np.dot(self.coef[variant], features(variant, x, u, w)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": "loss = a + b x + c x² + p u + q u² + r x u (+ s w + t w²), "
            "x = ln(d_model/L), u = ln(lr), w = ln(depth_lr_mult)",
            "coef": self.coef,
            "sigma": self.sigma,
            "shapes": {"fractions": list(FRACTIONS), "loss_over_final": self.shapes},
            "residual_rmse": self.residual_rmse,
        } | self.extra


def recorded_runs(landscape: Any) -> list[Run]:
    """Every finished run of a landscape as a `Run`."""
    runs = []
    for t in landscape.trials:
        if t.arch is None or not t.train:
            continue
        x = math.log(t.arch["d_model"] / t.arch["n_layers"])
        for r in t.train:
            if r.final_val_loss is None or not math.isfinite(r.final_val_loss):
                continue
            setting = dict(r.setting or t.setting or {})
            lr, dlm = float(setting.get("lr", 0.0)), float(setting.get("depth_lr_mult", 1.0))
            if lr <= 0:
                continue
            curve: tuple[tuple[float, float], ...] = ()
            if r.curve:
                last = float(r.curve[-1][0])
                curve = tuple(
                    (float(row[0]) / last, float(row[3]) / r.final_val_loss)
                    for row in r.curve
                    if row[3] is not None
                )
            w = math.log(dlm) if t.variant in MIXED and dlm > 0 else 0.0
            runs.append(
                Run(
                    t.variant,
                    x,
                    math.log(lr),
                    w,
                    float(r.final_val_loss),
                    curve,
                    (t.number, lr, dlm if t.variant in MIXED else 1.0),
                )
            )
    return runs


def fit(runs: list[Run], sigma: float = 0.0) -> Model:
    """Least squares per variant (see the module); curve shapes averaged per variant."""
    coef: dict[str, list[float]] = {}
    shapes: dict[str, list[float]] = {}
    residuals: list[float] = []
    for variant in sorted({r.variant for r in runs}):
        mine = [r for r in runs if r.variant == variant]
        a = np.array([features(variant, r.x, r.u, r.w) for r in mine])
        y = np.array([r.loss for r in mine])
        if len(mine) < a.shape[1]:
            raise ValueError(f"{variant}: {len(mine)} runs for {a.shape[1]} coefficients")
        beta, *_ = np.linalg.lstsq(a, y, rcond=None)
        coef[variant] = [float(b) for b in beta]
        residuals += list(y - a @ beta)
        with_curves = [r.curve for r in mine if len(r.curve) >= 2]
        shapes[variant] = [
            float(np.mean([_at(c, f) for c in with_curves])) if with_curves else 1.0
            for f in FRACTIONS
        ]
    rmse = float(np.sqrt(np.mean(np.square(residuals)))) if residuals else 0.0
    return Model(coef, sigma, shapes, rmse)


def _at(curve: tuple[tuple[float, float], ...], f: float) -> float:
    """A curve's loss ratio at fraction `f`, linearly interpolated."""
    xs, ys = [c[0] for c in curve], [c[1] for c in curve]
    return float(np.interp(f, xs, ys))


def seed_sigma(landscape: Any) -> float:
    """The pooled seed-to-seed standard deviation of the final loss over the points that
    hold two seeds or more."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in recorded_runs(landscape):
        groups.setdefault(r.point, []).append(r.loss)
    num, dof = 0.0, 0
    for losses in groups.values():
        if len(losses) > 1:
            num += float(np.var(losses, ddof=1)) * (len(losses) - 1)
            dof += len(losses) - 1
    if not dof:
        raise ValueError("no point of the landscape holds two seeds")
    return math.sqrt(num / dof)


def cross_validate(runs: list[Run], folds: int = 4, seed: int = 0) -> dict[str, float]:
    """K-fold by point: each point's runs predicted by a model fitted without them. The RMSE
    over every held-out run, and over the folds (min, max)."""
    points = sorted({r.point for r in runs})
    order = np.random.default_rng(seed).permutation(len(points))
    fold_of = {points[i]: k % folds for k, i in enumerate(order)}
    errors: list[float] = []
    per_fold: list[float] = []
    for k in range(folds):
        train = [r for r in runs if fold_of[r.point] != k]
        test = [r for r in runs if fold_of[r.point] == k]
        model = fit(train)
        e = [r.loss - model.mean(r.variant, r.x, r.u, r.w) for r in test]
        errors += e
        per_fold.append(float(np.sqrt(np.mean(np.square(e)))))
    return {
        "folds": folds,
        "rmse": float(np.sqrt(np.mean(np.square(errors)))),
        "fold_min": min(per_fold),
        "fold_max": max(per_fold),
    }


def generate(
    model: Model,
    template: Any,
    depths: tuple[int, ...] = DEPTHS,
    lrs: tuple[float, ...] = LRS,
    dlms: tuple[float, ...] = DLMS,
    seeds: int = 5,
    rng_seed: int = 0,
    variants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The surrogate landscape (a `depthscope-landscape` document): the template's job spec
    over `depths` (and `variants`, default the template's), lr `lrs` as a study axis and
    `depth_lr_mult` `dlms` tuned per trial, one trial per architecture holding every
    setting × `seeds` runs."""
    from nas_service.search.pricing import price_candidate
    from nas_service.spec import enumerate_candidates, parse_spec
    from nas_service.spec.space import CandidateSpace

    rng = np.random.default_rng(rng_seed)
    spec = template.job.spec.model_dump(mode="json")
    spec["name"] = "surrogate"
    spec["space"]["n_layers"] = list(depths)
    if variants:
        spec["space"]["variants"] = list(variants)
        if "block_attnres" not in variants:
            spec["space"]["block_sizes"] = None
    spec["training"]["lr"] = list(lrs)
    spec["tune"] = (spec.get("tune") or {}) | {"depth_lr_mult": list(dlms), "lr": None}
    spec["seeds"] = seeds
    spec["sampler"], spec["pruner"] = "grid", "none"
    parsed = parse_spec(spec)
    trial0 = template.trials[0].model_dump(mode="json")
    run0 = trial0["train"][0]
    trials: list[dict[str, Any]] = []
    for cand in enumerate_candidates(parsed):
        if cand.arch is None:
            continue
        params = CandidateSpace.to_study(cand.params)
        priced = price_candidate(parsed, params | {"lr": lrs[0]})
        if priced.train_spec is None:
            continue
        arch, ts = cand.arch, priced.train_spec
        variant = arch.variant
        x = math.log(arch.d_model / arch.n_layers)
        steps = ts.planned_steps()
        tokens = steps * ts.tokens_per_step
        fpt = ts.budget_flops / max(1, ts.planned_tokens()) if ts.budget_flops else 0.0
        settings = [(lr, d) for lr in lrs for d in (dlms if variant in MIXED else (1.0,))]
        runs: list[dict[str, Any]] = []
        for lr, dlm in settings:
            w = math.log(dlm) if variant in MIXED else 0.0
            mean = model.mean(variant, x, math.log(lr), w)
            setting = dict(run0["setting"]) | {"lr": lr, "depth_lr_mult": dlm}
            for s in range(seeds):
                final = mean + model.sigma * float(rng.standard_normal())
                curve = [
                    [
                        max(1.0, round(f * steps)),
                        max(1.0, round(f * steps)) * ts.tokens_per_step,
                        max(1.0, round(f * steps)) * ts.tokens_per_step * fpt,
                        final * ratio,
                    ]
                    for f, ratio in zip(FRACTIONS, model.shapes[variant], strict=True)
                ]
                curve[-1][3] = final
                run = copy.deepcopy(run0) | {
                    "status": "completed",
                    "reason": f"surrogate: trained {steps} steps",
                    "final_val_loss": final,
                    "best_val_loss": min(row[3] for row in curve),
                    "steps": steps,
                    "tokens_seen": tokens,
                    "flops_spent": tokens * fpt,
                    "flops_budget": ts.budget_flops,
                    "wall_time_s": run0["wall_time_s"] * tokens / max(1, run0["tokens_seen"]),
                    "seed": s,
                    "setting": setting,
                    "rung": 0,
                    "curve": curve,
                }
                runs.append(run)
        by_setting: dict[tuple[float, float], list[dict[str, Any]]] = {}
        for run in runs:
            by_setting.setdefault((run["setting"]["lr"], run["setting"]["depth_lr_mult"]), [])
            by_setting[(run["setting"]["lr"], run["setting"]["depth_lr_mult"])].append(run)
        summary = [
            {
                "setting": group[0]["setting"],
                "losses": [r["final_val_loss"] for r in group],
                "mean": float(np.mean([r["final_val_loss"] for r in group])),
            }
            for group in by_setting.values()
        ]
        chosen = min(summary, key=lambda g: g["mean"])  # the service's rule: lowest seed mean
        first = next(r for r in runs if r["setting"] == chosen["setting"])
        trials.append(
            trial0
            | {
                "number": len(trials),
                "variant": variant,
                "params": params | {"lr": chosen["setting"]["lr"]},
                "arch": arch.to_dict(),
                "metrics": dict(priced.metrics) | {"val_loss": chosen["mean"]},
                "values": [chosen["mean"]],
                "setting": chosen["setting"],
                "settings": summary,
                "train": runs,
                "curve": first["curve"],
                "seeds": chosen["losses"],
                "rungs": [],
            }
        )
    job = template.job.model_dump(mode="json") | {
        "id": "surrogate",
        "name": "surrogate",
        "study_name": "depthscope-surrogate",
        "spec": spec,
    }
    doc = {
        "format": "depthscope-landscape",
        "version": 1,
        "job": job,
        "corpus": template.corpus,
        "trials": trials,
        "generator": model.as_dict()
        | {"depths": list(depths), "lrs": list(lrs), "dlms": list(dlms), "seeds": seeds}
        | {"variants": spec["space"]["variants"]}
        | {"rng_seed": rng_seed},
    }
    doc["generator"]["optimum"] = true_optimum(model, doc)
    return doc


def true_optimum(model: Model, landscape: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per variant, the point of lowest model mean and its ln(d_model/L)."""
    out: dict[str, dict[str, float]] = {}
    for t in landscape["trials"]:
        a = t["arch"]
        x = math.log(a["d_model"] / a["n_layers"])
        for r in t["train"]:
            lr, dlm = r["setting"]["lr"], r["setting"]["depth_lr_mult"]
            w = math.log(dlm) if t["variant"] in MIXED else 0.0
            m = model.mean(t["variant"], x, math.log(lr), w)
            if m < out.get(t["variant"], {}).get("loss", math.inf):
                out[t["variant"]] = {
                    "loss": m,
                    "n_layers": a["n_layers"],
                    "d_model": a["d_model"],
                    "ln_d_over_L": x,
                    "lr": lr,
                    "depth_lr_mult": dlm,
                }
    return out


def main(argv: list[str] | None = None) -> int:
    from nas_service.results.landscape import load_landscape

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recorded", type=Path, default=RECORDED)
    ap.add_argument("--noise-from", type=Path, default=NOISE_FROM)
    ap.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    ap.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    ap.add_argument("--dlms", type=float, nargs="+", default=list(DLMS))
    ap.add_argument("--variants", nargs="+", help="default: the recorded landscape's")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rng-seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--json", type=Path, help="write the fit's report here")
    args = ap.parse_args(argv)

    recorded = load_landscape(args.recorded)
    runs = recorded_runs(recorded)
    sigma = seed_sigma(load_landscape(args.noise_from))
    model = fit(runs, sigma)
    cv = cross_validate(runs, args.folds)
    model.extra = {"cross_validation": cv, "fitted_to": args.recorded.name, "runs": len(runs)}
    doc = generate(
        model,
        recorded,
        tuple(args.depths),
        tuple(args.lrs),
        tuple(args.dlms),
        args.seeds,
        args.rng_seed,
        tuple(args.variants) if args.variants else None,
    )
    args.out.write_text(json.dumps(doc, separators=(",", ":")))
    points = sum(
        len({(r["setting"]["lr"], r["setting"]["depth_lr_mult"]) for r in t["train"]})
        for t in doc["trials"]
    )
    best = doc["generator"]["optimum"]
    print(
        f"fitted to {len(runs)} runs of {args.recorded.name}; seed noise from "
        f"{args.noise_from.name}"
    )
    print(f"{'seed noise σ':28} {sigma:.4f}")
    print(f"{'fit residual RMSE':28} {model.residual_rmse:.4f}")
    held_out = f"{cv['folds']}-fold held-out RMSE"
    print(f"{held_out:28} {cv['rmse']:.4f} (folds {cv['fold_min']:.4f}–{cv['fold_max']:.4f})")
    print(
        f"{'generated':28} {len(doc['trials'])} architectures, {points} points, "
        f"{sum(len(t['train']) for t in doc['trials'])} runs → {args.out}"
    )
    for v, b in sorted(best.items()):
        print(
            f"  true optimum {v:14} L={b['n_layers']:<3} d_model={b['d_model']:<4} "
            f"ln(d/L)={b['ln_d_over_L']:.2f} lr={b['lr']:g} dlm={b['depth_lr_mult']:g} "
            f"loss={b['loss']:.4f}"
        )
    if args.json:
        args.json.write_text(json.dumps(model.as_dict() | {"optimum": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
