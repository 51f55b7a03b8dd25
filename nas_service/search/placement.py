"""`sampler: optimum`: the grid of shapes, visited in the order that locates each variant's
loss-optimal d_model/L_b soonest, instead of at random.

The question a job answers is where the loss is lowest in x = ln(d_model/L_b), per variant,
with an interval (`search.optimum.fit_optimum`). A shape far from that optimum narrows the
interval little once the curvature is known; a shape near it narrows it most. So each new
trial goes to the variant with the fewest trials so far (ties: the space's order), and within
it to

- while it has under three shapes: the extremes of its explored range, then the middle (the
  three points a quadratic needs, as far apart as the grid allows);
- then, with a fitted minimum (inside the range or beyond an edge): the untried shape nearest
  to it, in x;
- with no minimum (the fit opens downwards): the untried shape farthest from every tried one.

Every other parameter of the grid (a searched head count, a joint training axis) is taken at
random among the points of the chosen shape, seeded by `sampler_seed`. Once every point is
visited the least-visited are revisited (the runner stops at `n_trials`). With `stop:
{optimum_interval}` the job ends as soon as the interval is narrow enough
(`search.scheduler.optimum_located`).

Optuna's public sampler interface only: the whole point of a trial is chosen at its first
`sample_independent` call (from the study's trials, read through `Study.get_trials`) and
handed out parameter by parameter."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from nas_service.search.optimum import fit_optimum, shape_points
from nas_service.spec import LOSS, CandidateSpace, JobSpec, build_candidate

Point = tuple[tuple[str, Any], ...]


class OptimumSampler(optuna.samplers.BaseSampler):
    """See the module's docstring."""

    def __init__(self, spec: JobSpec):
        self._spec = spec
        self._rng = np.random.default_rng(spec.sampler_seed)
        self._loss = spec.objectives.index(LOSS)
        grid = CandidateSpace(spec).grid()
        names = sorted(grid)
        #: every grid point with its shape: (variant, x = ln(d_model/L_b)); None: no valid arch
        self._points: list[tuple[Point, tuple[str, float] | None]] = []
        shapes: dict[Point, tuple[str, float] | None] = {}  # per architecture, built once
        for values in itertools.product(*(grid[n] for n in names)):
            point = tuple(zip(names, values, strict=True))
            candidate = CandidateSpace.from_study(dict(point))  # the training axes left out
            key = tuple(sorted(candidate.items()))
            if key not in shapes:
                arch = build_candidate(spec, candidate).arch
                shapes[key] = (
                    (arch.variant, math.log(arch.d_model / arch.n_layers)) if arch else None
                )
            self._points.append((point, shapes[key]))
        self._variants = list(dict.fromkeys(s[0] for _, s in self._points if s is not None))
        self._chosen: dict[int, dict[str, Any]] = {}
        self._fallback = optuna.samplers.RandomSampler(seed=spec.sampler_seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        if trial.number not in self._chosen:
            self._chosen[trial.number] = self.next_point(study.get_trials(deepcopy=False), trial)
        point = self._chosen[trial.number]
        if param_name in point:
            return point[param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Any,
    ) -> None:
        self._chosen.pop(trial.number, None)

    def next_point(self, trials: list[FrozenTrial], trial: FrozenTrial) -> dict[str, Any]:
        """The grid point for `trial`, given the study's `trials` (see the module's
        docstring)."""
        visits: Counter[Point] = Counter()
        for t in trials:
            if t.number != trial.number and t.params:
                visits[tuple(sorted(t.params.items()))] += 1
        open_points = [(p, s) for p, s in self._points if s is not None]
        least = min(visits[p] for p, _ in open_points)
        candidates = [(p, s) for p, s in open_points if visits[p] == least]
        # the variant with the fewest trials so far, among those with points left
        per_variant: Counter[str] = Counter()
        for p, s in open_points:
            per_variant[s[0]] += visits[p]
        left = list(dict.fromkeys(s[0] for _, s in candidates))
        variant = min(left, key=lambda v: (per_variant[v], self._variants.index(v)))
        mine = [(p, s[1]) for p, s in candidates if s[0] == variant]
        tried = sorted({s[1] for p, s in open_points if s[0] == variant and visits[p] > 0})
        x = self._target(variant, [s for _, s in mine], tried, trials)
        nearest = min(abs(s - x) for _, s in mine)
        ties = [p for p, s in mine if abs(s - x) == nearest]
        return dict(ties[int(self._rng.integers(len(ties)))])

    def _target(
        self, variant: str, untried: list[float], tried: list[float], trials: list[FrozenTrial]
    ) -> float:
        """Where in x the variant's next shape should lie."""
        xs = sorted({s[1] for _, s in self._points if s is not None and s[0] == variant})
        lo, hi = xs[0], xs[-1]
        if len(tried) == 0:
            return lo
        if len(tried) == 1:
            return hi if tried[0] == lo else lo
        if len(tried) == 2:
            return (lo + hi) / 2
        ratios, losses = shape_points(trials, self._loss).get(variant, ([], []))
        fit = fit_optimum(variant, ratios, losses, bootstrap=0)
        if fit.optimum_ratio is not None:
            return math.log(fit.optimum_ratio)
        # no minimum yet (or too few finished): the untried shape farthest from the tried
        return max(untried, key=lambda x: min(abs(x - t) for t in tried))
