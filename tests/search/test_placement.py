"""`sampler: optimum` (`search.placement.OptimumSampler`): the grid's shapes in the order that
locates each variant's optimum soonest: the variant with the fewest trials first; within it
the two extremes of its explored ln(d_model/L_b), then the middle, then the untried shape
nearest the fitted minimum; every point once before any twice. Checked on synthetic studies
whose truth is known, and through a study that asks it for real."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas_service.search.placement import OptimumSampler
from nas_service.search.study import make_sampler
from nas_service.spec import parse_spec
from nas_service.store.records import TrialAttr
from tests.support.jobs import TINY

#: 8 depths at one width: x = ln(64/L) from ln 64 (L = 1) down to ln 8 (L = 8)
DEPTHS = list(range(1, 9))
SPACE = {"n_layers": DEPTHS, "d_model": [64], "head_dim": 16, "variants": ["baseline"]}


def _spec(**change: Any) -> Any:
    return parse_spec(TINY | {"space": SPACE, "sampler": "optimum", "n_trials": 20} | change)


def _done(n_layers: int, loss: float, variant: str = "baseline") -> FrozenTrial:
    residual = variant if variant == "baseline" else f"{variant}/S=1"
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        values=[loss],
        params={"residual": residual, "n_layers": n_layers, "d_model": 64},
        distributions={
            "residual": optuna.distributions.CategoricalDistribution([residual]),
            "n_layers": optuna.distributions.CategoricalDistribution(DEPTHS),
            "d_model": optuna.distributions.CategoricalDistribution([64]),
        },
        user_attrs={TrialAttr.ARCH: {"variant": variant, "n_layers": n_layers, "d_model": 64}},
    )


def _next(sampler: OptimumSampler, trials: list[FrozenTrial]) -> dict[str, Any]:
    me = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[0.0])
    me.number = 10_000
    return sampler.next_point(trials, me)


def test_three_spread_shapes_first_then_the_one_nearest_the_fitted_minimum() -> None:
    sampler = OptimumSampler(_spec())
    # the truth: lowest loss at L = 3 (x = ln(64/3))
    truth = {n: 2 + (math.log(64 / n) - math.log(64 / 3)) ** 2 for n in DEPTHS}
    trials: list[FrozenTrial] = []
    order = []
    for _ in range(5):
        point = _next(sampler, trials)
        order.append(point["n_layers"])
        trials.append(_done(point["n_layers"], truth[point["n_layers"]]))
    # deepest (x lowest), shallowest, the middle in x (between L = 2 and 3: ln 64/√8 = L ≈ 2.8)
    assert order[:3] == [8, 1, 3]
    # the fit of three exact points puts the minimum at L = 3 (tried): the nearest untried
    # shapes in x are L = 4 (ln 4/3 = 0.29 away), then L = 2 (ln 3/2 = 0.41)
    assert order[3] == 4 and order[4] == 2


def test_a_minimum_beyond_the_edge_pulls_toward_that_edge() -> None:
    sampler = OptimumSampler(_spec())
    truth = {n: 2 + 0.3 * n for n in DEPTHS}  # the shallowest is best: the minimum beyond L = 1
    trials = [_done(n, truth[n]) for n in (8, 1, 3)]
    assert _next(sampler, trials)["n_layers"] == 2  # the untried shape nearest that edge


def test_the_variant_with_fewest_trials_goes_first_and_no_point_twice_before_all_once() -> None:
    space = SPACE | {"variants": ["baseline", "block_attnres"], "block_sizes": [1]}
    sampler = OptimumSampler(_spec(space=space))
    trials = [_done(8, 2.5), _done(1, 2.4)]
    assert _next(sampler, trials)["residual"] == "block_attnres/S=1"
    seen = set()
    trials = []
    for _ in range(16):  # the whole grid: 2 variants × 8 depths
        point = _next(sampler, trials)
        key = (point["residual"], point["n_layers"])
        assert key not in seen
        seen.add(key)
        variant = point["residual"].split("/")[0]
        trials.append(_done(point["n_layers"], 2 + 0.01 * point["n_layers"], variant))
    assert len(seen) == 16
    assert _next(sampler, trials)  # then revisits


def test_a_study_asks_it_through_optuna() -> None:
    spec = _spec()
    sampler = make_sampler(spec)
    assert isinstance(sampler, OptimumSampler)
    study = optuna.create_study(sampler=sampler)
    depths = []
    for _ in range(3):
        trial = study.ask()
        residual = trial.suggest_categorical("residual", ["baseline"])
        n_layers = trial.suggest_categorical("n_layers", DEPTHS)
        assert trial.suggest_categorical("d_model", [64]) == 64
        assert residual == "baseline"
        depths.append(n_layers)
        trial.set_user_attr(
            TrialAttr.ARCH, {"variant": "baseline", "n_layers": n_layers, "d_model": 64}
        )
        study.tell(trial, 2.0 + n_layers / 10)
    assert depths == [8, 1, 3]
