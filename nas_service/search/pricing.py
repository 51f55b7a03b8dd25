"""A candidate priced before it trains: every cost metric of its architecture in the job's
cost context (`cost_model.price`, cached per architecture and context), the constraints, and
the `TrainSpec` of a seed at the trial's setting (`price_candidate`).

With `cost.layout: auto`, `prime_layouts` prices a whole enumerable space at its best layouts
in one vectorised pass (`cost_model.best_layouts`, then `price_many` per chosen layout); the
runner does it when it loads such a job and keeps the answers with the job, and
`price_candidate(…, layouts=…)` reads them (the same numbers the one-candidate search,
`_best_layout_metrics`, gives), searching one candidate at a time only for what was not
primed.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

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
from cost_model.timing import train_step_time
from nas_service.search.study import training_setting, trial_budget
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
from workers.contract import TrainSpec

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
