"""Job spec → Optuna study: sampler, `suggest`, a trial's budget, settings and runs; what is
told back.

Studies are ordinary Optuna studies in the service's database (readable by any Optuna tool).
The study's parameters are those of `spec.CandidateSpace` (the one description of the
space, and of the `residual` codec: a variant, or `block_attnres/S=<size>`): `residual`,
`n_layers`, the width axis (`d_model` or `aspect_ratio`), `n_heads` when searched, `budget`
when there are several, then the joint training axes under their own names (`lr`, ...). No
conditional parameters, so every sampler (grid included) sees one flat space.

A trial's *setting* is the value of every training axis (`TRAINING_AXES`) it trains at:
`training_setting` (fixed values from the spec, joint ones from the trial's parameters). With
`tune`, a trial trains at every setting of the nested grid (`tune_settings`), each with
`seeds` runs: `runs_per_trial`. A candidate is priced before it trains in
`nas_service.search.pricing`.
"""

from __future__ import annotations

import itertools
import math
import statistics
import warnings
from typing import Any

import optuna

from cost_model.residuals import DEPTH_MIXED
from nas_service.search.numbers import finite_or_none
from nas_service.search.placement import OptimumSampler
from nas_service.search.pruning import FractionMedianPruner, fraction_step
from nas_service.search.scheduler import make_pruner
from nas_service.spec import TRAINING_AXES as TRAINING_AXES  # re-exported: the runner's
from nas_service.spec import (
    CandidateSpace,
    JobSpec,
)
from nas_service.store.records import SeedStats, SettingRecord, StudyAttr, TrainRun
from workers.contract import EvalPoint, TrainResult

# user attributes the service writes on trials


def grid_space(spec: JobSpec) -> dict[str, list[Any]]:
    """The study's flat space, every parameter with all its values (the grid sampler's)."""
    return CandidateSpace(spec).grid()


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid sampler stops the study when the grid is exhausted, which only works
    inside `optimize`; the runner stops at `n_trials` itself (revisiting grid points)."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None


def make_sampler(spec: JobSpec) -> optuna.samplers.BaseSampler:
    seed = spec.sampler_seed
    if spec.sampler == "grid":
        return _Grid(grid_space(spec), seed=seed)
    if spec.sampler == "optimum":
        return OptimumSampler(spec)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True)


def report_step(spec: JobSpec, step: int, tokens: float, budget_tokens: float) -> int:
    """The step an evaluation is reported to the study at: the raw optimizer step under
    `pruner: median`, else its fraction of the trial's budget (`pruning.fraction_step`)."""
    if spec.pruner == "median":
        return step
    return fraction_step(tokens, budget_tokens)


def prune_reason(pruner: optuna.pruners.BasePruner, step: int, val_loss: float) -> str:
    """Why the study's pruner stopped a trial whose evaluation at optimizer step `step` it
    judged: the verdict of the budget-fraction rule, or the raw-step median rule's."""
    if isinstance(pruner, FractionMedianPruner) and pruner.last is not None:
        return pruner.last.reason()
    return f"median pruner at step {step} (val_loss {val_loss:.4f})"


def create_study(spec: JobSpec, storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        directions=["minimize"] * len(spec.objectives),
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
    )
    with warnings.catch_warnings():  # metric names are "experimental" in Optuna, and harmless
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(spec.objectives))
    study.set_user_attr(StudyAttr.OBJECTIVES, list(spec.objectives))
    return study


def load_study(spec: JobSpec, storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    return optuna.load_study(
        study_name=name, storage=storage, sampler=make_sampler(spec), pruner=make_pruner(spec)
    )


def suggest(trial: optuna.Trial, spec: JobSpec) -> dict[str, Any]:
    """The trial's study parameters (`CandidateSpace.suggest`; the fixed ones of an enqueued
    trial come back as they were)."""
    return CandidateSpace(spec).suggest(trial)


def trial_budget(spec: JobSpec, params: dict[str, Any]) -> float:
    """The budget of a trial: its own `budget` parameter, or the job's single budget."""
    return float(params.get("budget", spec.budget.values()[0]))


def training_setting(spec: JobSpec, params: dict[str, Any]) -> dict[str, float]:
    """The setting a trial trains at, every axis of `TRAINING_AXES` (in that order): a fixed
    axis's value from `spec.training`, a joint one's from the trial's parameters (a `tune`
    axis is fixed here: `tune_settings` varies it). Raises ValueError naming a joint axis the
    parameters lack."""
    joint = spec.training.searched()
    setting = {}
    for name in TRAINING_AXES:
        if name in joint:
            if name not in params:
                raise ValueError(f"the trial has no value of the joint training axis {name!r}")
            setting[name] = float(params[name])
        else:
            setting[name] = float(getattr(spec.training, name))
    return setting


def tune_settings(spec: JobSpec, params: dict[str, Any]) -> list[dict[str, float]]:
    """The settings a trial trains at: `[training_setting(spec, params)]` without `tune`;
    with it, one per element of the product of the `tune` lists (`itertools.product` over
    the listed axes in `TRAINING_AXES` order, the last axis varying fastest), the other axes
    at their `training_setting` value. A variant without depth-mixing parameters
    (`cost_model.residuals.DEPTH_MIXED`) is trained once per the other axes' values: its
    `depth_lr_mult` multiplies nothing, so it stays at its `training_setting` value."""
    base = training_setting(spec, params)
    if spec.tune is None:
        return [base]
    lists = _tune_lists(spec, CandidateSpace.from_study(params)["variant"])
    return [
        base | dict(zip(lists, combo, strict=True))
        for combo in itertools.product(*(map(float, v) for v in lists.values()))
    ]


def _tune_lists(spec: JobSpec, variant: str) -> dict[str, list[float]]:
    """The `tune` lists a variant trains over (none of `depth_lr_mult` without depth mixing)."""
    lists = spec.tune.axes() if spec.tune is not None else {}
    if variant not in DEPTH_MIXED:
        lists.pop("depth_lr_mult", None)
    return lists


def runs_of(spec: JobSpec, variant: str) -> int:
    """The training runs of one trial of `variant`: seeds × its `tune` settings, then its
    confirmation seeds."""
    settings = math.prod(len(v) for v in _tune_lists(spec, variant).values())
    return spec.seeds * settings + spec.confirm_seeds


def runs_per_trial(spec: JobSpec) -> int:
    """Training runs of one trained trial (`JobSpec.trial_runs`: at most, since a variant
    without depth-mixing parameters trains one `depth_lr_mult`)."""
    return spec.trial_runs


def objective_values(
    spec: JobSpec, loss: float, metrics: dict[str, float], bpb_per_loss: float | None = None
) -> list[float]:
    """The trial's objective values: `loss` (nats per token) for val_loss, `loss` times
    `bpb_per_loss` (bits per byte per nat per token, a run's val_bpb / val_loss: the same
    for every run of a job, whose validation batches are the same) for val_bpb (NaN when
    not known: a corpus of raw tokens has no bytes), the priced `metrics` for the rest."""
    bpb = math.nan if bpb_per_loss is None else loss * bpb_per_loss
    return [
        loss if m == "val_loss" else bpb if m == "val_bpb" else metrics[m] for m in spec.objectives
    ]


def bpb_per_loss(val_bpb: float, val_loss: float) -> float | None:
    """The ratio of a run's bits per byte to its loss (None when either is not finite)."""
    ratio = val_bpb / val_loss if val_loss else math.nan
    return ratio if math.isfinite(ratio) else None


def train_summary(result: TrainResult) -> TrainRun:
    """What a trial keeps of a training run (the curve is kept apart)."""
    return {
        "status": result.status,
        "reason": result.reason,
        "final_val_loss": finite_or_none(result.final_val_loss),
        "best_val_loss": finite_or_none(result.best_val_loss),
        "final_val_bpb": finite_or_none(result.final_val_bpb),
        "best_val_bpb": finite_or_none(result.best_val_bpb),
        "steps": result.steps,
        "tokens_seen": result.tokens_seen,
        "flops_spent": result.flops_spent,
        "flops_budget": result.flops_budget,
        "wall_time_s": result.wall_time_s,
        "tokens_per_s": result.tokens_per_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "memory_kind": result.memory_kind,
        "device": result.device,
        "device_name": result.device_name,
        "saved_tensor_bytes": result.saved_tensor_bytes,
        "state_bytes": result.state_bytes,
        "peak_rss_bytes": result.peak_rss_bytes,
        "corpus": result.corpus,
    }


def curve_rows(points: list[EvalPoint]) -> list[list[float]]:
    return [[p.step, p.tokens, p.flops, p.val_loss] for p in points]


def chosen_setting(table: list[SettingRecord]) -> int | None:
    """The index of the setting of lowest mean loss (the first of equal means; None when no
    setting has a mean): what a trial with a `tune` grid keeps."""
    means = [(row["mean"], s) for s, row in enumerate(table) if row["mean"] is not None]
    return min(means, key=lambda m: m[0])[1] if means else None


def seed_statistics(losses: list[float]) -> SeedStats:
    return {
        "mean": statistics.fmean(losses),
        "std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
        "min": min(losses),
        "max": max(losses),
    }


def cannot_reach_front(
    study_trials: list[optuna.trial.FrozenTrial],
    spec: JobSpec,
    metrics: dict[str, float],
    loss_now: float,
    fraction: float,
    curves: list[list[list[float]]],
    bpb_ratio: float | None = None,
) -> str | None:
    """The multi-objective pruning rule: costs are known before training, so only the loss
    decides. Project the final loss optimistically — the current loss times the largest
    relative improvement any finished trial made from the same fraction of its run to its
    end — and stop the candidate if a finished trial is at least as good on every objective
    with that projection and better on one. Returns the reason, or None to go on."""
    ratios = []
    for curve in curves:
        if len(curve) < 2:
            continue
        final_tokens, final_loss = curve[-1][1], curve[-1][3]
        at = [row for row in curve if row[1] <= fraction * final_tokens]
        if at and at[-1][3] > 0:
            ratios.append(final_loss / at[-1][3])
    if not ratios:  # no finished run says how much a loss can still fall from here
        return None
    best_ratio = min(1.0, *ratios)
    optimistic = loss_now * best_ratio
    mine = objective_values(spec, optimistic, metrics, bpb_ratio)
    for t in study_trials:
        if t.state != optuna.trial.TrialState.COMPLETE or t.values is None:
            continue
        theirs = list(t.values)
        if all(a <= b for a, b in zip(theirs, mine, strict=True)) and any(
            a < b for a, b in zip(theirs, mine, strict=True)
        ):
            return (
                f"trial {t.number} dominates even the optimistic final loss {optimistic:.4f} "
                f"(now {loss_now:.4f} at {fraction:.0%} of the budget)"
            )
    return None
