"""`stop: {optimum_interval}`: the scheduler ends a job once every variant's loss-optimal
d_model/L_b is inside the explored shapes with a 90% interval as narrow as asked
(`search.scheduler.optimum_located`), fitted as the results fit it; never while the optimum
lies at the edge, while the interval is wider, or while a variant has too few shapes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from nas_service.results.analysis import fit_optimum
from nas_service.search.scheduler import FIFO, Start, optimum_located, scheduler_for
from nas_service.spec import parse_spec
from nas_service.store.records import TrialAttr
from tests.support.jobs import TINY

#: the truth: loss = 2 + 0.5·(x − ln 20)², x = ln(d_model/L), optimum at d_model/L = 20
BEST = 20.0
SHAPES = [(1, 80), (2, 80), (3, 72), (4, 64), (6, 48), (8, 40), (12, 36)]  # ratios 80 … 3


def _truth(ratio: float) -> float:
    return 2 + 0.5 * (math.log(ratio) - math.log(BEST)) ** 2


def _trial(variant: str, n_layers: int, d_model: int, loss: float) -> FrozenTrial:
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        values=[loss],
        user_attrs={TrialAttr.ARCH: {"variant": variant, "n_layers": n_layers, "d_model": d_model}},
    )


def _trials(
    variant: str, shapes: list[tuple[int, int]], noise: float = 0.0, seed: int = 0
) -> list[FrozenTrial]:
    rng = np.random.default_rng(seed)
    return [
        _trial(variant, n, d, _truth(d / n) + noise * float(rng.standard_normal()))
        for n, d in shapes
    ]


def _spec(width: float, variants: list[str] | None = None) -> Any:
    variants = variants or ["baseline"]
    space = {k: v for k, v in TINY["space"].items() if k != "block_sizes"} | {"variants": variants}
    if "block_attnres" in variants:
        space["block_sizes"] = TINY["space"]["block_sizes"]
    return parse_spec(TINY | {"space": space, "stop": {"optimum_interval": width}})


def test_a_located_optimum_ends_the_job_with_what_the_results_report() -> None:
    trials = _trials("baseline", SHAPES, noise=0.01)
    message = optimum_located(_spec(10.0), trials)
    assert message is not None
    fit = fit_optimum("baseline", [d / n for n, d in SHAPES], [t.values[0] for t in trials])
    assert fit.verdict == "ok" and fit.ci_low is not None and fit.ci_high is not None
    assert abs(math.log(fit.optimum_ratio or 0) - math.log(BEST)) < 0.1
    # the message carries the results' own answer: the same fit, the same interval
    assert f"baseline {fit.optimum_ratio:.3g} [{fit.ci_low:.3g}, {fit.ci_high:.3g}]" in message
    width = math.log(fit.ci_high / fit.ci_low)
    assert f"(ln-width {width:.2f})" in message
    # asked for narrower than the data give: not yet
    assert optimum_located(_spec(width * 0.9), trials) is None
    assert optimum_located(_spec(width * 1.1), trials) is not None


def test_more_shapes_and_less_noise_narrow_it_until_the_job_may_stop() -> None:
    spec = _spec(0.1)
    noisy = _trials("baseline", SHAPES[1:6], noise=0.05, seed=1)
    assert optimum_located(spec, noisy) is None  # five noisy shapes: wider than 0.1
    quiet = _trials("baseline", SHAPES, noise=0.002, seed=1)
    assert optimum_located(spec, quiet) is not None


def test_an_optimum_at_the_edge_or_with_too_few_shapes_never_stops_the_job() -> None:
    spec = _spec(10.0)
    shallow_side = [(n, d) for n, d in SHAPES if d / n > 30]  # the truth's minimum beyond them
    assert optimum_located(spec, _trials("baseline", shallow_side)) is None
    assert optimum_located(spec, _trials("baseline", SHAPES[:2])) is None  # two shapes
    assert optimum_located(spec, []) is None


def test_a_fit_of_few_points_never_stops_the_job_however_narrow() -> None:
    # five shapes on the truth to a thousandth: the interval is narrow, but one or two
    # degrees of freedom beyond the quadratic say little about the scatter, and a search
    # that stops at the first narrow interval of so few points is often wrong
    spec = _spec(10.0)
    five = _trials("baseline", SHAPES[1:6], noise=0.001, seed=3)
    fit = fit_optimum("baseline", [d / n for n, d in SHAPES[1:6]], [t.values[0] for t in five])
    assert fit.verdict == "ok" and fit.ci_low is not None and fit.ci_high is not None
    assert math.log(fit.ci_high / fit.ci_low) < 10.0
    assert optimum_located(spec, five) is None
    assert optimum_located(spec, five + _trials("baseline", SHAPES[:1], 0.001, 4)) is not None


def test_every_variant_must_be_located() -> None:
    spec = _spec(10.0, ["baseline", "block_attnres"])
    located = _trials("baseline", SHAPES, noise=0.01)
    assert optimum_located(spec, located) is None  # block_attnres has no trial yet
    both = located + _trials("block_attnres", SHAPES, noise=0.01, seed=2)
    message = optimum_located(spec, both)
    assert message is not None and "baseline" in message and "block_attnres" in message


def test_fifo_starts_nothing_more_once_answered() -> None:
    spec = _spec(10.0)
    scheduler = scheduler_for(spec)
    assert isinstance(scheduler, FIFO)
    study = optuna.create_study()
    scheduler.observe(study, set())
    assert scheduler.answered is None and scheduler.next_slot(0, 0) == Start()
    for t in _trials("baseline", SHAPES, noise=0.01):
        study.add_trial(t)
    scheduler.observe(study, set())
    assert scheduler.answered is not None
    assert scheduler.next_slot(len(SHAPES), 0) is None  # n_trials (4) is not what stops it
    # without `stop`, the same study changes nothing
    plain = scheduler_for(parse_spec(TINY | {"n_trials": 20}))
    plain.observe(study, set())
    assert plain.answered is None and plain.next_slot(len(SHAPES), 0) == Start()
