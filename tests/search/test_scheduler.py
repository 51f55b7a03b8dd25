"""The scheduler contract (`nas_service.search.scheduler`): what a free slot does next. FIFO
starts candidates until `n_trials` are counted or in flight; successive halving resumes the
best waiting trial first, counts the waiting ones against `n_trials`, and gives up the
waiting trials no result can promote once the job is idle."""

from __future__ import annotations

from typing import Any

import optuna

from nas_service.search.fidelity import promotion_count
from nas_service.search.scheduler import (
    FIFO,
    Resume,
    Start,
    SuccessiveHalving,
    make_pruner,
    scheduler_for,
)
from nas_service.spec import parse_spec
from nas_service.store.records import TrialAttr
from tests.support.jobs import TINY

FIDELITY: dict[str, Any] = TINY | {
    "name": "fidelity",
    "budget": {"tokens": 4 * 32 * 27},
    "n_trials": 9,
    "fidelity": {"rungs": [1 / 9, 1 / 3, 1], "reduction": 3},
    "training": TINY["training"] | {"schedule": "wsd", "n_evals": 3},
}


def test_fifo_starts_a_candidate_while_fewer_than_n_trials_are_counted_or_in_flight() -> None:
    spec = parse_spec(TINY | {"n_trials": 4})
    scheduler = scheduler_for(spec)
    assert isinstance(scheduler, FIFO) and scheduler.rungs == 1 and not scheduler.pauses
    scheduler.observe(optuna.create_study(), set())
    assert scheduler.next_slot(0, 0) == Start()
    assert scheduler.next_slot(2, 1) == Start()
    assert scheduler.next_slot(2, 2) is None and scheduler.next_slot(4, 0) is None
    assert scheduler.settle(idle=True) == [] and scheduler.waiting == []
    assert scheduler.first_rung(17) == 0 and scheduler.expected_compute() == 1.0
    assert scheduler.rung_record(0, 1.0, [1.0], 3, 384, []) is None
    assert scheduler.prunes_points() and scheduler.start_note() == ""


def _waiting_at_rung_0(study: optuna.Study, losses: list[float]) -> list[int]:
    numbers = []
    for loss in losses:
        trial = study.ask()
        record = {"rung": 0, "loss": loss, "values": [loss], "promoted": False}
        trial.set_user_attr(TrialAttr.RUNGS, [record])
        trial.set_user_attr(TrialAttr.WAITING, 0)
        numbers.append(trial.number)
    return numbers


def test_successive_halving_resumes_the_best_waiting_trial_before_starting_one() -> None:
    spec = parse_spec(FIDELITY)
    scheduler = scheduler_for(spec)
    assert isinstance(scheduler, SuccessiveHalving) and scheduler.rungs == 3
    assert scheduler.pauses and not scheduler.prunes_points()
    assert isinstance(make_pruner(spec), optuna.pruners.NopPruner)
    study = optuna.create_study()
    numbers = _waiting_at_rung_0(study, [0.5, 0.2, 0.9])
    scheduler.observe(study, set())
    assert len(scheduler.waiting) == 3
    slot = scheduler.next_slot(0, 0)  # ⌊3/3⌋ = 1 of the rung goes on: the best loss
    assert isinstance(slot, Resume)
    assert slot.waiting.trial.number == numbers[1] and slot.rung == 1
    assert len(scheduler.waiting) == 2
    assert scheduler.next_slot(0, 1) == Start()  # nothing else promotable: a new candidate
    assert scheduler.next_slot(6, 1) is None  # 6 counted + 1 in flight + 2 waiting = 9
    assert scheduler.settle(idle=False) == []  # a later result may still promote them
    told = scheduler.settle(idle=True)  # idle, nothing promotable: no result can arrive
    assert sorted(w.trial.number for w, _ in told) == [numbers[0], numbers[2]]
    assert all("not among the best 1/3" in reason for _, reason in told)
    assert scheduler.waiting == []


def test_a_trial_in_flight_never_waits_and_one_never_promotable_is_given_up_at_once() -> None:
    spec = parse_spec(FIDELITY | {"n_trials": 3})
    scheduler = scheduler_for(spec)
    study = optuna.create_study()
    numbers = _waiting_at_rung_0(study, [0.1, 0.3, 0.2])
    scheduler.observe(study, {numbers[0]})  # in flight again: not waiting
    assert [w.trial.number for w in scheduler.waiting] == numbers[1:]
    assert promotion_count(3, 3.0) == 1  # at most one of 3 results goes on from rung 0
    # 0.1 holds the one promotion: 0.3 and 0.2 are behind it, whatever arrives
    told = scheduler.settle(idle=False)
    assert sorted(w.trial.number for w, _ in told) == numbers[1:]
