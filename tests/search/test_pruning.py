"""The default pruner (`pruner: auto`, `nas_service.search.pruning.FractionMedianPruner`):
the median rule at equal fractions of the budget, with a warm-up and a minimum of completed peers.

The runner tests replay a synthetic landscape with the real runner on the simulated backend
(`nas_service.runner.simulated`): the shipped WSD landscape's 12 architectures × 3 learning rates
(at fixed compute their runs take 594 to 740 steps), every run's curve rewritten so that one
run, the *winner*, is the worst of all for the first quarter of its budget and the best of
all from a third on. The naive rule (`pruner: median`, Optuna's median at raw steps, the
default of earlier versions) prunes it at its first evaluation; the default keeps it and
still prunes the runs that are above the median at equal fractions once enough have
completed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from nas_service.api.schemas import LandscapeRead
from nas_service.jobs import submit
from nas_service.results.landscape import load_landscape
from nas_service.runner.loop import Runner
from nas_service.runner.simulated import SimulatedBackend
from nas_service.search.pruning import (
    FRACTION_SCALE,
    MARGIN,
    MIN_PEERS,
    WARMUP,
    FractionMedianPruner,
    fraction_step,
    value_at,
)
from nas_service.search.scheduler import make_pruner
from nas_service.spec import parse_spec
from tests.support.jobs import counted, setup, study_of

ROOT = Path(__file__).resolve().parents[2]
WSD = load_landscape(ROOT / "bench" / "landscapes" / "crossover_wsd.json")
#: the landscape trial whose runs become the winner (block AttnRes, 8 layers, lr 0.004)
WINNER = 31
WINNER_PARAMS = {"residual": "block_attnres/S=4", "n_layers": 8, "lr": 0.004}


def _loss(number: int, x: float) -> float:
    """The synthetic loss of landscape trial `number`'s runs at fraction `x` of the budget:
    straight lines from 3.0 to a final loss 2.0 + 0.02 × number (the higher the number, the
    worse at every fraction); the winner 3.6 until 30% of its budget, then 1.8 + 0.3 (1 − x),
    below every other from there on."""
    if number == WINNER:
        return 3.6 if x < 0.3 else 1.8 + 0.3 * (1 - x)
    final = 2.0 + 0.02 * number
    return final + (3.0 - final) * (1 - x)


def slow_winner() -> LandscapeRead:
    trials = []
    for t in WSD.trials:
        runs = []
        for run in t.train:
            assert run.curve
            last = float(run.curve[-1][1] or 0.0)
            curve = [[*r[:3], _loss(t.number, float(r[1] or 0.0) / last)] for r in run.curve]
            runs.append(run.model_copy(update={"curve": curve, "final_val_loss": curve[-1][3]}))
        trials.append(t.model_copy(update={"train": runs}))
    return WSD.model_copy(update={"trials": trials})


SLOW_WINNER = slow_winner()


def job(pruner: str) -> dict[str, Any]:
    spec: dict[str, Any] = WSD.job.spec.model_dump(mode="json")
    return spec | {
        "name": f"slow-winner-{pruner}",
        "tune": None,
        "seeds": 1,
        "max_concurrent": 1,
        "sampler": "grid",
        "sampler_seed": 0,
        "n_trials": 36,
        "pruner": pruner,
    }


def run(tmp_path: Path, pruner: str) -> list[FrozenTrial]:
    url = f"sqlite:///{tmp_path / f'{pruner}.db'}"
    settings, Session = setup(url)
    submitted = submit(Session, settings, job(pruner))
    backend = SimulatedBackend(SLOW_WINNER, workers=1, overhead_scale=0.0)
    Runner(settings, backend=backend).run(poll_s=0, timeout_s=120)
    trials = counted(study_of(url, submitted))
    assert len(trials) == 36
    return trials


def winner(trials: list[FrozenTrial]) -> FrozenTrial:
    (found,) = [t for t in trials if t.params == WINNER_PARAMS]
    return found


def test_the_naive_median_rule_prunes_the_slow_winner(tmp_path: Path) -> None:
    """The trap is real: Optuna's median at raw steps (the old default, now `pruner:
    median`) meets the winner at its first evaluation and stops it."""
    w = winner(run(tmp_path, "median"))
    assert w.state == TrialState.PRUNED
    assert w.user_attrs["reason"].startswith("median pruner at step")
    assert max(w.intermediate_values) < 100  # a raw step, the first evaluation


def test_the_default_keeps_the_slow_winner_and_prunes_losers(tmp_path: Path) -> None:
    trials = run(tmp_path, "auto")
    w = winner(trials)
    assert w.state == TrialState.COMPLETE
    best = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
    assert best.number == w.number and w.values[0] == pytest.approx(1.8)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(pruned) >= 10, "the clear losers are still pruned"
    completed_before = 0
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == TrialState.COMPLETE:
            completed_before += 1
            continue
        assert t.state == TrialState.PRUNED and t.user_attrs["outcome"] == "pruned"
        at = max(t.intermediate_values)  # the fraction it was judged at
        assert WARMUP * FRACTION_SCALE <= at < FRACTION_SCALE
        assert completed_before >= MIN_PEERS
        assert "budget-fraction median rule" in t.user_attrs["reason"]
        assert f"of {completed_before} completed trials" in t.user_attrs["reason"]
        # it was above the median of the completed trials at its fraction
        loss = t.intermediate_values[at]
        assert loss > 2.0 + (3.0 - 2.0) * (1 - at / FRACTION_SCALE)
    # every report of every trial is at a fraction of its own budget
    for t in trials:
        assert all(0 < s <= FRACTION_SCALE for s in t.intermediate_values)
        if t.state == TrialState.COMPLETE:
            assert max(t.intermediate_values) == FRACTION_SCALE


# -- the rule on hand-made trials ------------------------------------------------------------


def _trial(number: int, values: dict[float, float], budget: float | None = None) -> FrozenTrial:
    """A trial with intermediate values at budget fractions (keys as fractions)."""
    params: dict[str, Any] = {"x": 0.5}
    dists: dict[str, Any] = {"x": FloatDistribution(0, 1)}
    if budget is not None:
        params["budget"], dists["budget"] = budget, FloatDistribution(0, 1e20)
    trial = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        value=list(values.values())[-1],
        params=params,
        distributions=dists,
        intermediate_values={round(f * FRACTION_SCALE): v for f, v in values.items()},
    )
    trial.number = number
    return trial


def _peers(n: int, budget: float | None = None) -> list[FrozenTrial]:
    """`n` completed trials reporting at 0.1, 0.2, …, 1.0 with loss 3 − f (+0.01 per trial)."""
    return [
        _trial(i, {k / 10: 3.0 - k / 10 + 0.01 * i for k in range(1, 11)}, budget) for i in range(n)
    ]


def _running(number: int, values: dict[float, float], budget: float | None = None) -> FrozenTrial:
    trial = _trial(number, values, budget)
    trial.state, trial.values = TrialState.RUNNING, None
    return trial


def test_a_clear_loser_is_pruned_when_peers_exist() -> None:
    pruner = FractionMedianPruner()
    loser = _running(99, {0.1: 3.5, 0.2: 3.4, 0.5: 3.0})
    verdict = pruner.judge(_peers(MIN_PEERS), loser)
    assert verdict is not None
    assert verdict.fraction == 0.5 and verdict.value == 3.0 and verdict.peers == MIN_PEERS
    assert verdict.median == pytest.approx(2.5 + 0.01 * (MIN_PEERS // 2))
    # at or below the median it goes on
    assert pruner.judge(_peers(MIN_PEERS), _running(99, {0.5: 2.5})) is None


def test_a_trial_within_the_margin_above_the_median_goes_on() -> None:
    """The peers are the survivors (the best the sampler found): a trial tied with them is
    not a clear loser."""
    peers = _peers(MIN_PEERS)
    median = 2.5 + 0.01 * (MIN_PEERS // 2)
    assert MARGIN == 0.01 and FractionMedianPruner().margin == MARGIN
    close = _running(99, {0.5: median * 1.009})
    assert FractionMedianPruner().judge(peers, close) is None
    assert FractionMedianPruner(margin=0.0).judge(peers, close) is not None
    verdict = FractionMedianPruner().judge(peers, _running(99, {0.5: median * 1.011}))
    assert verdict is not None and "more than 1.0% above the median" in verdict.reason()
    with pytest.raises(ValueError, match="margin"):
        FractionMedianPruner(margin=-0.1)


def test_nothing_is_pruned_before_the_warmup() -> None:
    pruner = FractionMedianPruner(warmup=0.4)
    peers = _peers(10)
    assert pruner.judge(peers, _running(99, {0.3: 9.0})) is None  # far worse, but early
    assert pruner.judge(peers, _running(99, {0.3: 9.0, 0.4: 9.0})) is not None
    assert FractionMedianPruner().warmup == WARMUP == pytest.approx(1 / 3)
    assert FractionMedianPruner().judge(peers, _running(99, {0.3: 9.0})) is None


def test_too_few_peers_decide_nothing() -> None:
    pruner = FractionMedianPruner(min_peers=5)
    loser = _running(99, {0.6: 9.0})
    assert pruner.judge(_peers(4), loser) is None
    assert pruner.judge(_peers(5), loser) is not None
    # peers of another budget are no peers: the same five at a budget of 2e15 count for
    # nothing against a trial of 1e15
    other = _peers(5, budget=2e15)
    assert pruner.judge(other, _running(99, {0.6: 9.0}, budget=1e15)) is None
    assert pruner.judge(other, _running(99, {0.6: 9.0}, budget=2e15)) is not None


def test_peers_are_read_at_the_same_fraction_by_interpolation() -> None:
    """Peers that evaluated at other fractions are interpolated at the trial's; one whose
    evaluations do not reach the fraction is not a peer there."""
    pruner = FractionMedianPruner(min_peers=3, margin=0.0)
    # three peers at 0.4 → 2.0 and 0.6 → 1.0: 1.5 at 0.5
    peers = [_trial(i, {0.4: 2.0, 0.6: 1.0}) for i in range(3)]
    assert pruner.judge(peers, _running(99, {0.5: 1.49})) is None
    verdict = pruner.judge(peers, _running(99, {0.5: 1.51}))
    assert verdict is not None and verdict.median == pytest.approx(1.5)
    # at 0.7 none reaches: nothing decided
    assert pruner.judge(peers, _running(99, {0.7: 9.0})) is None
    assert value_at({10: 1.0, 20: math.nan}, 15) == math.inf  # a diverged peer: +∞
    assert value_at({}, 1) is None


def test_fraction_steps() -> None:
    assert fraction_step(0, 100) == 0
    assert fraction_step(50, 100) == FRACTION_SCALE // 2
    assert fraction_step(100, 100) == FRACTION_SCALE
    assert fraction_step(101, 100) == FRACTION_SCALE  # a last step past the planned tokens
    with pytest.raises(ValueError, match="budget_tokens"):
        fraction_step(1, 0)


def test_which_pruner_a_spec_gets() -> None:
    base = job("auto") | {"sampler": "tpe"}
    assert isinstance(make_pruner(parse_spec(base)), FractionMedianPruner)
    naive = make_pruner(parse_spec(base | {"pruner": "median"}))
    assert type(naive) is optuna.pruners.MedianPruner
    for off in (
        base | {"pruner": "none"},
        base | {"objectives": ["val_loss", "params"]},  # cannot_reach_front, in the runner
    ):
        assert isinstance(make_pruner(parse_spec(off)), optuna.pruners.NopPruner)
