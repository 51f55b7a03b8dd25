"""Job spec → Optuna study; ask → `ArchConfig`; pricing and constraints before training; the
`TrainSpec` of a candidate; what is told back.

Studies are ordinary Optuna studies in the service's database (readable by any Optuna tool).
The study's parameters are those of `spec.CandidateSpace` (the one description of the
space, and of the `residual` codec: a variant, or `block_attnres/S=<size>`): `residual`,
`n_layers`, the width axis (`d_model` or `aspect_ratio`), `n_heads` when searched, `budget`
when there are several, then the joint training axes under their own names (`lr`, ...). No
conditional parameters, so every sampler (grid included) sees one flat space.

A trial's *setting* is the value of every training axis (`TRAINING_AXES`) it trains at:
`training_setting` (fixed values from the spec, joint ones from the trial's parameters). With
`tune`, a trial trains at every setting of the nested grid (`tune_settings`), each with
`seeds` runs: `runs_per_trial`. The costs depend on the architecture only, so they are
computed once per architecture and cost context (`price_candidate`'s LRU cache).

With `cost.layout: auto`, `prime_layouts` prices a whole enumerable space at its best layouts
in one vectorised pass (`cost_model.best_layouts`, then `price_many` per chosen layout); the
runner does it when it loads such a job and keeps the answers with the job, and
`price_candidate(…, layouts=…)` reads them (the same numbers the one-candidate search,
`_best_layout_metrics`, gives), searching one candidate at a time only for what was not
primed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import statistics
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from cost_model import (
    LAYOUT_METRICS,
    METRICS,
    RECOMPUTE_MODES,
    ArchConfig,
    ArchGrid,
    CostInputError,
    CostReport,
    GridLayouts,
    Layout,
    LayoutSpace,
    Parallelism,
    Workload,
    best_layouts,
    get_hardware,
    price,
    price_many,
    search_layout,
)
from cost_model.calibration import StepModel
from cost_model.hardware import Hardware
from cost_model.report import grid_groups
from cost_model.residuals import DEPTH_MIXED
from cost_model.timing import train_step_time
from nas_service.search.numbers import finite_or_none
from nas_service.search.pruning import FractionMedianPruner, fraction_step
from nas_service.search.scheduler import make_pruner
from nas_service.spec import (
    CALIBRATED,
    CandidateSpace,
    CorpusLocation,
    JobSpec,
    SpecError,
    StepCalibration,
    Training,
    build_candidate,
    enumerate_candidates,
    space_size,
)
from nas_service.spec import TRAINING_AXES as TRAINING_AXES  # re-exported: the runner's
from nas_service.store.records import SeedStats, StudyAttr, TrainRun
from workers.contract import EvalPoint, TrainResult, TrainSpec

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
    """The training runs of one trial of `variant`: seeds × its `tune` settings."""
    return spec.seeds * math.prod(len(v) for v in _tune_lists(spec, variant).values())


def runs_per_trial(spec: JobSpec) -> int:
    """Training runs of one trained trial: seeds × the number of `tune` settings (at most:
    a variant without depth-mixing parameters trains one `depth_lr_mult`)."""
    return spec.seeds * spec.tune_size


#: Cost reports kept (`_cost_metrics`): trials differing only in their training axes, or
#: asked again (retries, pruned and re-suggested shapes), price their architecture once.
COST_CACHE_SIZE = 4096


def _as_hardware(hardware: str | Hardware) -> Hardware:
    """A preset by name, or a described cluster (`cost.cluster`) as it is."""
    return hardware if isinstance(hardware, Hardware) else get_hardware(hardware)


@functools.lru_cache(maxsize=COST_CACHE_SIZE)
def _cost_metrics(
    arch: ArchConfig,
    workload: Workload,
    layout: Parallelism,
    hardware: str | Hardware,
    calibration: StepCalibration | None = None,
) -> tuple[tuple[str, float], ...]:
    """Every cost metric of `arch` in a cost context (`cost_model.price`), as immutable
    pairs: the costs depend on the architecture and the context only, never on the budget or
    the training axes. With a calibration, `calibrated_step_time_s` too."""
    report = price(arch, workload, layout, _as_hardware(hardware))
    metrics = {k: float(v) for k, v in report.metrics().items()}
    return tuple((metrics | _calibrated(report, calibration)).items())


def _calibrated(report: CostReport, calibration: StepCalibration | None) -> dict[str, float]:
    """`calibrated_step_time_s` of a priced step (`StepModel.step_time`), or nothing."""
    if calibration is None:
        return {}
    return {CALIBRATED: float(_step_model(calibration).step_time(report.step_time))}


def _step_model(calibration: StepCalibration) -> StepModel:
    return StepModel(
        compute_factor=calibration.compute_factor,
        memory_factor=calibration.memory_factor,
        overhead_s=calibration.overhead_s,
        rows=calibration.trials,
    )


@functools.lru_cache(maxsize=COST_CACHE_SIZE)
def _best_layout_metrics(
    arch: ArchConfig,
    workload: Workload,
    space: LayoutSpace,
    hardware: str | Hardware,
    memory_cap_bytes: float | None,
    calibration: StepCalibration | None = None,
) -> tuple[tuple[tuple[str, float], ...], str]:
    """`cost.layout: auto`: every cost metric of `arch` at its fastest layout of `space`
    (`cost_model.search_layout`) and that layout's `LAYOUT_METRICS`, as immutable pairs, and
    an empty reason; or no pairs and the reason no layout is feasible."""
    hw = _as_hardware(hardware)
    found = search_layout(arch, space, workload, hw, memory_cap_bytes)
    if found.best is None:
        return (), found.reason
    best = found.best.layout
    report = price(arch, best.workload(workload), best.parallelism(), hw)
    metrics = {k: float(v) for k, v in report.metrics().items()} | found.metrics()
    return tuple((metrics | _calibrated(report, calibration)).items()), ""


# -- a job's space at its best layouts, in one pass --------------------------------------------
#: `_best_layout_metrics`'s answer: the metric pairs and an empty reason, or none and why.
LayoutAnswer = tuple[tuple[tuple[str, float], ...], str]
#: The cost context of `cost.layout: auto` (`_layout_context`): workload, layout space,
#: hardware, memory cap, calibration.
LayoutContext = tuple[Workload, LayoutSpace, str | Hardware, float | None, StepCalibration | None]
#: A job's architectures primed at their best layouts (`prime_layouts`).
Layouts = Mapping[ArchConfig, LayoutAnswer]

#: What one group of `cost_model.best_layouts` (candidates sharing their categorical fields,
#: e.g. one variant) costs, in one-candidate searches (`search_layout`): the grid search pays
#: a fixed price per layout whatever the group's size (up to thousands), so priming only pays
#: when the job prices more architectures than about this many per group. Measured on the
#: job of `python bench/cost_model.py --job 10000 --job-only`: a group of 2,000 candidates
#: costs 55 one-candidate searches on 8 devices (690 layouts), 130-230 on 64 (3,123 layouts).
PRIME_SEARCHES_PER_GROUP = 100

log = logging.getLogger(__name__)


def _layout_context(spec: JobSpec) -> LayoutContext:
    cost = spec.cost
    return (
        cost.workload(spec.training),
        cost.layout_space(),
        cost.hardware_model() if cost.cluster else cost.hardware,
        cost.memory_cap_bytes,
        cost.calibration,
    )


def prime_layouts(
    spec: JobSpec, limit: int | None, searches_per_group: float | None = None
) -> Layouts:
    """Every valid candidate of a `cost.layout: auto` job at its best layout, in one
    vectorised pass: the answers `price_candidate(…, layouts=…)` reads (the runner keeps them
    with the job while it drives it).

    None are primed (an empty mapping) with `layout: fixed`, for a space of more than `limit`
    candidates (`enumerate_candidates`: the operator's `max_candidates_enumerated`), or when
    the job prices fewer architectures (at most `n_trials`) than `searches_per_group` per
    group of the grid search (default `PRIME_SEARCHES_PER_GROUP`; the one-candidate path is
    then the faster). The answers are `_best_layout_metrics`' (tested equal to the bit): the
    layout `best_layouts` chooses, every metric there (`price_many`, per chosen layout),
    `LAYOUT_METRICS`, the calibrated step time, or the reason no layout is feasible. A
    candidate the vectorised pass cannot price is left to the one-candidate path."""
    if spec.cost.layout != "auto":
        return {}
    if searches_per_group is None:
        searches_per_group = PRIME_SEARCHES_PER_GROUP
    if min(spec.n_trials, space_size(spec)) < searches_per_group:  # not even one group pays
        return {}
    start = time.perf_counter()
    try:
        archs = list(
            dict.fromkeys(c.arch for c in enumerate_candidates(spec, limit) if c.arch is not None)
        )
    except SpecError:  # more candidates than the limit
        return {}
    groups = sum(1 for _ in grid_groups(archs))
    if not archs or min(spec.n_trials, len(archs)) < searches_per_group * groups:
        return {}
    try:
        answers = _answers(archs, *_layout_context(spec))
    except CostInputError as exc:  # the one-candidate path says why, candidate by candidate
        log.warning("layouts not primed for %d architectures: %s", len(archs), exc)
        return {}
    log.info(
        "%d architectures priced at their best layouts in %.1f s",
        len(answers),
        time.perf_counter() - start,
    )
    return answers


def _answers(
    archs: list[ArchConfig],
    workload: Workload,
    space: LayoutSpace,
    hardware: str | Hardware,
    memory_cap_bytes: float | None,
    calibration: StepCalibration | None,
) -> dict[ArchConfig, LayoutAnswer]:
    """`_best_layout_metrics` of many architectures: the best layouts at once, then the
    architectures priced together per chosen layout."""
    hw = _as_hardware(hardware)
    found = best_layouts(archs, space, workload, hw, memory_cap_bytes)
    answers: dict[ArchConfig, LayoutAnswer] = {}
    by_layout: dict[Layout, list[int]] = {}
    for i, arch in enumerate(archs):
        if not found.valid[i]:
            continue  # not an architecture to the grid: the one-candidate path
        if found.found[i]:
            by_layout.setdefault(_chosen(found, i), []).append(i)
        else:
            answers[arch] = ((), str(found.reasons[i]))
    for layout, idx in by_layout.items():
        members = [archs[i] for i in idx]
        wl, par = layout.workload(workload), layout.parallelism()
        prices = price_many(members, wl, par, hw)
        if calibration is not None:
            prices[CALIBRATED] = _calibrated_many(members, wl, par, hw, calibration)
        for j, i in enumerate(idx):
            metrics = {name: float(prices[name][j]) for name in METRICS}
            metrics |= {name: float(found.metrics[name][i]) for name in LAYOUT_METRICS}
            if calibration is not None:
                metrics[CALIBRATED] = float(prices[CALIBRATED][j])
            if not all(math.isfinite(v) for v in metrics.values()):
                continue  # the one-candidate path
            answers[archs[i]] = (tuple(metrics.items()), "")
    return answers


def _chosen(found: GridLayouts, i: int) -> Layout:
    """The best layout of candidate `i` of a `best_layouts` answer."""
    m = {name: found.metrics[name][i] for name in LAYOUT_METRICS}
    return Layout(
        tensor=int(m["best_layout_tensor"]),
        pipeline=int(m["best_layout_pipeline"]),
        virtual=int(m["best_layout_virtual"]),
        data=int(m["best_layout_data"]),
        micro_batch=int(m["best_layout_micro_batch"]),
        microbatches=int(m["best_layout_microbatches"]),
        recompute=RECOMPUTE_MODES[int(m["best_layout_recompute"])],
        sequence_parallel=bool(m["best_layout_sequence_parallel"]),
    )


def _calibrated_many(
    configs: list[ArchConfig],
    workload: Workload,
    parallel: Parallelism,
    hw: Hardware,
    calibration: StepCalibration,
) -> np.ndarray:
    """`calibrated_step_time_s` of many architectures at one layout (`_calibrated`'s)."""
    model = _step_model(calibration)
    out = np.full(len(configs), np.nan)
    for idx, first, axes in grid_groups(configs):
        grid = ArchGrid.build(first, **axes)
        times = model.step_time(train_step_time(grid, workload, parallel, hw))
        out[idx] = np.where(grid.valid, np.broadcast_to(times, (len(idx),)), np.nan)
    return out


@dataclass
class Priced:
    """A candidate after pricing: its arch and metrics, or why it is not trained."""

    params: dict[str, Any]
    arch_dict: dict[str, Any] | None
    metrics: dict[str, float]
    outcome: str  # "train", "infeasible" or "over_constraint"
    reason: str
    train_spec: TrainSpec | None


_SPEC_CORPUS: Any = object()


def price_candidate(
    spec: JobSpec,
    params: dict[str, Any],
    seed: int = 0,
    corpus: CorpusLocation | str | None = _SPEC_CORPUS,
    layouts: Layouts | None = None,
) -> Priced:
    """Arch for the params, every cost metric, the constraints, and the `TrainSpec` of seed
    `seed` at the trial's `training_setting` (a run at another setting or seed:
    `train_spec.replace(**setting, seed=k)`). The metrics are computed once per architecture
    and cost context (an LRU of `COST_CACHE_SIZE`), or read from `layouts`, the job's
    `prime_layouts` answers. `corpus` is what the workers read: the runner passes the spec's
    corpus as located in the operator's data folder (`spec.locate_corpus`: read beneath it,
    no link followed); by default the spec's own."""
    candidate = build_candidate(spec, CandidateSpace.from_study(params))
    if candidate.arch is None:
        return Priced(params, None, {}, "infeasible", candidate.reason, None)
    arch = candidate.arch
    workload, layout = spec.cost.workload(spec.training), spec.cost.parallelism()
    if spec.cost.layout == "auto":
        answer = layouts.get(arch) if layouts else None
        pairs, why = (
            answer if answer is not None else _best_layout_metrics(arch, *_layout_context(spec))
        )
        if not pairs:
            reason = f"no parallel layout: {why}"
            return Priced(params, arch.to_dict(), {}, "infeasible", reason, None)
        metrics = dict(pairs)
    else:
        metrics = dict(
            _cost_metrics(
                arch,
                workload,
                layout,
                spec.cost.hardware_model() if spec.cost.cluster else spec.cost.hardware,
                spec.cost.calibration,
            )
        )
    for constraint in spec.constraints:
        value = metrics[constraint.metric]
        if value > constraint.max:
            reason = f"{constraint.metric} = {value:.4g} is over the cap {constraint.max:.4g}"
            return Priced(params, arch.to_dict(), metrics, "over_constraint", reason, None)
    # the fields of the same names, but the training axes (lists or ranges in the spec) as
    # the trial's setting
    training = spec.training.model_dump(exclude=set(Training.ARCH_FIELDS) | set(TRAINING_AXES))
    tokens = training.pop("tokenizer")  # {kind, vocab_size}: TrainSpec's two fields
    training |= {"tokenizer": tokens["kind"], "tokenizer_vocab": tokens.get("vocab_size")}
    training |= training_setting(spec, params)
    budget = spec.budget.train_fields(trial_budget(spec, params))
    corpus = spec.training.corpus if corpus is _SPEC_CORPUS else corpus
    where = (
        {"corpus": corpus.path, "corpus_root": corpus.root}
        if isinstance(corpus, CorpusLocation)
        else {"corpus": corpus}
    )
    train_spec = TrainSpec(arch=arch, seed=seed, **budget, **training | where)
    if train_spec.planned_steps() < 1:
        reason = f"the budget buys {train_spec.planned_tokens()} tokens, less than one step"
        return Priced(params, arch.to_dict(), metrics, "infeasible", reason, None)
    return Priced(params, arch.to_dict(), metrics, "train", "", train_spec)


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
