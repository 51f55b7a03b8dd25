"""The arithmetic of a fidelity job's rungs (`nas_service.search.rungs`): the expected compute of a
candidate (the ETA of a job scales by it) pinned to hand-computed cases and to a simulation
of the brackets through `rung_spec`, both reuse modes; the main-line stops of short runs."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from cost_model import ArchConfig
from nas_service.search.fidelity import bracket_of, bracket_sizes, promotion_count, rung_steps
from nas_service.search.rungs import rung_stops
from nas_service.search.scheduler import scheduler_for
from nas_service.settings import get_settings
from nas_service.spec import JobSpec, SpecError, check_job, parse_spec
from tests.support.api import error
from tests.support.hostile import reason_of, with_
from workers.contract import TrainSpec

WSD = ("training.schedule", "wsd")


def _job(
    rungs: list[float], eta: float = 3, brackets: int = 1, reuse: str = "checkpoint"
) -> JobSpec:
    fidelity = {"rungs": rungs, "reduction": eta, "brackets": brackets, "reuse": reuse}
    return parse_spec(with_(("fidelity", fidelity), WSD))


# -- expected_compute -------------------------------------------------------------------------
def test_expected_compute_of_hand_computed_ladders() -> None:
    """Rungs 1/9, 1/3, 1 with η = 3. One bracket: 1/9 + (2/9)/3 + (2/3)/9 = 7/27 resumed from
    checkpoints, 1/9 + (1/3)/3 + 1/9 = 1/3 retrained. Three brackets (9, 5 and 3 of every 17
    trials): bracket 1 costs 1/3 + (2/3)/3 = 5/9 (retrained: 1/3 + 1/3 = 2/3), bracket 2 a
    whole run, so (9·7/27 + 5·5/9 + 3)/17 = 73/153 ≈ 0.477 and (9·1/3 + 5·2/3 + 3)/17 = 28/51.
    Ignoring the bracket's start rung (η^−k for η^−(k−b)) gives 0.211 for the first."""
    ladder = [1 / 9, 1 / 3, 1.0]
    assert scheduler_for(_job(ladder)).expected_compute() == pytest.approx(7 / 27, rel=1e-12)
    assert scheduler_for(_job(ladder, reuse="retrain")).expected_compute() == pytest.approx(
        1 / 3, rel=1e-12
    )
    assert scheduler_for(_job(ladder, brackets=3)).expected_compute() == pytest.approx(
        73 / 153, rel=1e-12
    )
    assert scheduler_for(
        _job(ladder, brackets=3, reuse="retrain")
    ).expected_compute() == pytest.approx(28 / 51, rel=1e-12)
    # two brackets (η = 2: ⌈2/2 · 2⌉ = 2 and ⌈2/1 · 1⌉ = 2 of every 4), rungs 1/4, 1/2, 1:
    # bracket 0 costs 1/4 + (1/4)/2 + (1/2)/4 = 1/2, bracket 1 1/2 + (1/2)/2 = 3/4 → 5/8
    assert scheduler_for(
        _job([0.25, 0.5, 1.0], eta=2, brackets=2)
    ).expected_compute() == pytest.approx(5 / 8, rel=1e-12)
    no_fidelity = parse_spec(with_(WSD))
    assert scheduler_for(no_fidelity).expected_compute() == 1.0


def _base(total: int, schedule: str = "wsd") -> TrainSpec:
    arch = ArchConfig(variant="baseline", n_layers=2, d_model=32, n_heads=2, seq_len=16)
    return TrainSpec(arch=arch, budget_tokens=total * 2 * 16, batch_size=2, schedule=schedule)  # type: ignore[arg-type]


def _simulated(spec: JobSpec, total: int) -> Fraction:
    """A candidate's mean compute, in straight runs, over whole cycles of trial numbers: each
    trial's bracket from `bracket_of`, ⌊n/η⌋ of each rung's n promoted, every rung's run
    from `rung_spec` (its main-line steps, or its tokens from scratch) over the straight
    run's."""
    fidelity = spec.fidelity
    assert fidelity is not None
    k, eta = len(fidelity.rungs), float(fidelity.reduction)
    cycle = sum(bracket_sizes(fidelity.brackets, eta))
    trials = cycle * round(eta) ** k  # every ⌊n/η⌋ below exact
    base = _base(total)
    per_bracket: dict[int, int] = {}
    for number in range(trials):
        b = bracket_of(number, fidelity)
        per_bracket[b] = per_bracket.get(b, 0) + 1
    spent = Fraction(0)
    for first, n in per_bracket.items():
        for rung in range(first, k):
            run = scheduler_for(spec).run_of(base, rung, first, lambda r: f"k{r}", "memory://x")
            if fidelity.reuse == "retrain":
                assert run.budget_tokens is not None and base.budget_tokens is not None
                share = Fraction(run.budget_tokens, base.budget_tokens)
            else:
                stop = total if run.stop_step is None else run.stop_step
                share = Fraction(stop - run.start_step, total)
            spent += n * share
            assert n % eta == 0 or rung == k - 1
            n = promotion_count(n, eta)
    return Fraction(spent, trials)


@pytest.mark.parametrize("reuse", ["checkpoint", "retrain"])
@pytest.mark.parametrize(
    ("rungs", "eta", "brackets"),
    [
        ([1 / 9, 1 / 3, 1.0], 3, 1),
        ([1 / 9, 1 / 3, 1.0], 3, 2),
        ([1 / 9, 1 / 3, 1.0], 3, 3),
        ([0.125, 0.25, 0.5, 1.0], 2, 4),
        ([0.125, 0.25, 0.5, 1.0], 2, 2),
        ([0.0625, 0.25, 1.0], 4, 3),
        ([0.1, 0.2, 0.4, 0.6, 1.0], 2, 5),
    ],
)
def test_expected_compute_matches_a_simulation_of_the_brackets(
    rungs: list[float], eta: int, brackets: int, reuse: str
) -> None:
    spec = _job(rungs, eta=eta, brackets=brackets, reuse=reuse)
    total = 14_400  # every fraction above lands on a whole step
    simulated = _simulated(spec, total)
    assert scheduler_for(spec).expected_compute() == pytest.approx(float(simulated), rel=1e-6)


# -- rung_stops -------------------------------------------------------------------------------
def _ladder(rng: random.Random) -> list[float]:
    k = rng.randint(2, 8)
    inner = sorted({round(rng.uniform(0.001, 0.999), 3) for _ in range(k - 1)})
    return [*inner, 1.0]


def test_rung_stops_are_strictly_increasing_whenever_the_run_has_a_step_per_rung() -> None:
    rng = random.Random(25)
    cases = 0
    for _ in range(3000):
        fractions = _ladder(rng)
        first = rng.randrange(len(fractions))
        n = len(fractions) - first
        total = rng.choice([rng.randint(n, n + 3), rng.randint(n, 40), rng.randint(n, 5000)])
        stops = rung_stops(fractions, first, total)
        assert len(stops) == n
        assert stops[-1] == total, (fractions, first, total, stops)
        assert stops[0] >= 1
        assert all(a < b for a, b in itertools.pairwise(stops)), (
            fractions,
            first,
            total,
            stops,
        )
        wanted = [rung_steps(f, total) for f in fractions[first:]]
        if all(a < b for a, b in itertools.pairwise(wanted)):
            assert stops == wanted  # nothing moved that did not need to
        cases += 1
    assert cases == 3000


def test_rung_stops_of_short_runs() -> None:
    assert rung_stops([1 / 9, 1 / 3, 1.0], 0, 4) == [1, 2, 4]
    assert rung_stops([1 / 9, 1 / 3, 1.0], 0, 3) == [1, 2, 3]
    assert rung_stops([1 / 9, 1 / 3, 1.0], 1, 2) == [1, 2]
    # rounded, the last three rungs would all end at step 5 of 5
    assert rung_stops([0.2, 0.8, 0.85, 0.9, 1.0], 0, 5) == [1, 2, 3, 4, 5]
    assert rung_stops([0.5, 0.7, 1.0], 0, 3) == [1, 2, 3]
    assert rung_stops([0.5, 1.0], 1, 1) == [1]
    with pytest.raises(ValueError, match=r"2 steps.*3 rungs"):
        rung_stops([0.5, 0.7, 1.0], 0, 2)


@pytest.mark.parametrize(
    ("fractions", "first", "total"),
    [
        ([1 / 9, 1 / 3, 1.0], 0, 3),
        ([1 / 9, 1 / 3, 1.0], 0, 4),
        ([1 / 9, 1 / 3, 1.0], 1, 2),
        ([0.2, 0.4, 0.6, 0.8, 1.0], 0, 5),
        ([0.1, 0.3, 0.5, 0.7, 1.0], 0, 6),
    ],
)
def test_every_rung_of_a_short_run_is_a_valid_segment(
    fractions: list[float], first: int, total: int
) -> None:
    """The runs `rung_spec` gives a short candidate chain up: each starts where the one before
    stopped, from its checkpoint, and the last ends the run; `TrainSpec` accepts each (a
    repeated stop is refused there, failing the rung's trial)."""
    spec = _job(fractions)
    base = _base(total).replace(decay_frac=0.0)
    runs = [
        scheduler_for(spec).run_of(base, rung, first, lambda r: f"rung{r}", "memory://x")
        for rung in range(first, len(fractions))
    ]
    assert runs[0].start_step == 0 and runs[0].checkpoint_in is None
    for before, after in itertools.pairwise(runs):
        assert before.stop_step is not None and before.stop_step == after.start_step
        assert before.checkpoint_out is not None
        assert after.checkpoint_in == before.checkpoint_out
    assert runs[-1].stop_step is None and runs[-1].checkpoint_out is None


def test_a_job_whose_runs_have_fewer_steps_than_rungs_is_refused_naming_the_rungs() -> None:
    # 2 steps of 512 tokens (batch_size 8 × seq_len 64): the first rung (0.5) buys one
    # step, but three rungs cannot end at three different steps
    data: dict[str, Any] = with_(
        ("fidelity", {"rungs": [0.5, 0.7, 1.0]}), WSD, ("budget", {"tokens": 1024})
    )
    with pytest.raises(SpecError) as refused:
        check_job(parse_spec(data), get_settings())
    reason = reason_of(refused.value.errors, "fidelity.rungs")
    assert "2 optimizer steps" in reason and "3 rungs" in reason
    # one step more and each rung ends at a step of its own
    data["budget"] = {"tokens": 1536}
    assert check_job(parse_spec(data), get_settings())
    # retrained rungs are runs of their own: no stop to share
    data["budget"] = {"tokens": 1024}
    data["fidelity"] = {"rungs": [0.5, 0.7, 1.0], "reuse": "retrain"}
    assert check_job(parse_spec(data), get_settings())


def test_a_job_with_fewer_steps_than_rungs_is_refused_over_http_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app

    data = with_(("fidelity", {"rungs": [0.5, 0.7, 1.0]}), WSD, ("budget", {"tokens": 1024}))
    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))
    with TestClient(app) as client:
        response = client.post("/v1/jobs", json=data)
        body = error(response, 422)
        assert body["field"] == "fidelity.rungs", body
        assert "fewer than the 3 rungs" in body["message"], body
        assert client.get("/v1/jobs").json()["total"] == 0
