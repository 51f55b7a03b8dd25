"""The runner's database work per trial, counted in statements (deterministic, unlike time):
on the simulated backend (`nas_service.runner.simulated`) over a SQLite file, a job of 60 trials on
8 workers, then a runner stopped half way and a second one recovering its trials.

What each bound keeps out (`bench/scale.py` measures the time; these the causes):
- a trial told is not read back from the database (`Study.tell` returns a copy read after
  its state changed: six statements per trial);
- the loop does not read the job list on every pass (two queries a pass, several passes a
  trial), nor the study when it wrote nothing since its last read;
- a run row is updated without being read first;
- recovery asks the database once, not once per left trial, when a trial last finished.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Engine

from nas_service.jobs import submit
from nas_service.results.landscape import load_landscape
from nas_service.runner import starts as runner_module  # where a trial is priced
from nas_service.runner.loop import JOB_LIST_REFRESH_S, Runner
from nas_service.runner.simulated import SimulatedBackend
from nas_service.store import TrialRun
from nas_service.store.records import TrialAttr
from tests.support.jobs import counted, setup, study_of
from workers.contract import TrainResult

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE = load_landscape(ROOT / "bench" / "landscapes" / "crossover.json")
N_TRIALS, WORKERS = 60, 8


def job_spec() -> dict[str, Any]:
    spec: dict[str, Any] = LANDSCAPE.job.spec.model_dump(mode="json")
    tune = spec.pop("tune") or {}
    return spec | {
        "training": spec["training"] | {k: tune[k] for k in ("lr", "depth_lr_mult")},
        "tune": None,
        "seeds": 1,
        "sampler": "random",
        "pruner": "none",
        "n_trials": N_TRIALS,
        "max_concurrent": WORKERS,
    }


class Statements:
    """Every statement any engine of this process runs, by its normalised text."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen[" ".join(statement.split())] += 1

    def total(self) -> int:
        return sum(self.seen.values())

    def matching(self, pattern: str) -> int:
        return sum(n for text, n in self.seen.items() if re.search(pattern, text))

    def clear(self) -> None:
        self.seen.clear()


@pytest.fixture
def statements() -> Iterator[Statements]:
    counter = Statements()
    event.listen(Engine, "before_cursor_execute", counter)
    try:
        yield counter
    finally:
        event.remove(Engine, "before_cursor_execute", counter)


class Stop(BaseException):
    """Ends a runner's life from inside its loop, its trials left running (as a kill)."""


class StopsHalfWay(SimulatedBackend):
    results = 0

    def next_item(self, handle: Any) -> Any:
        item = super().next_item(handle)
        if isinstance(item, TrainResult):
            self.results += 1
            if self.results >= N_TRIALS // 2:
                raise Stop
        return item


def test_a_trial_costs_a_bounded_number_of_statements(
    tmp_path: Path, statements: Statements
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings, Session = setup(url, max_concurrent_trials=64)
    job = submit(Session, settings, job_spec())
    backend = SimulatedBackend(LANDSCAPE, workers=WORKERS, duration_s=60.0, overhead_scale=0.0)
    runner = Runner(settings, backend=backend)
    statements.clear()
    started = time.monotonic()
    runner.run(poll_s=0, timeout_s=120)
    wall = time.monotonic() - started
    assert len(counted(study_of(url, job))) == N_TRIALS
    per_trial = statements.total() / N_TRIALS
    # measured 16.5: Optuna's own trial creation and state change are 8 of them; a trial's
    # suggested parameters are one INSERT (they were one each), its run row one INSERT
    # once it is known to train (it was an INSERT before the ask and an UPDATE after)
    assert per_trial <= 18, statements.seen.most_common(12)
    assert statements.matching(r"^UPDATE ds_trial_runs SET trial_number") == 0
    assert statements.matching(r"^INSERT INTO trial_params") <= 1.1 * N_TRIALS
    # a trial is read back whole only in the loop's batched re-read, never one by one
    assert statements.matching(r"FROM trial_system_attributes") < N_TRIALS
    # the job list: read once per JOB_LIST_REFRESH_S and when the runner changed a status
    listed = statements.matching(r"FROM ds_jobs WHERE ds_jobs.status")
    assert listed <= 2 * (wall / JOB_LIST_REFRESH_S + 4), (listed, wall)
    # run rows are updated in place: the only reads of ds_trial_runs are recovery's
    assert statements.matching(r"^SELECT .* FROM ds_trial_runs WHERE ds_trial_runs.id = ") == 0


def test_recovery_reads_progress_once_per_job(tmp_path: Path, statements: Statements) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings, Session = setup(url, max_concurrent_trials=64)
    job = submit(Session, settings, job_spec())
    first = Runner(settings, backend=StopsHalfWay(LANDSCAPE, workers=WORKERS, duration_s=60.0))
    with pytest.raises(Stop):
        first.run(poll_s=0, timeout_s=120)
    first.engine.dispose()
    left = study_of(url, job).get_trials(states=(optuna.trial.TrialState.RUNNING,))
    # those in flight but the ones whose results arrived with the stopping one (timing)
    assert WORKERS // 2 <= len(left) <= WORKERS
    statements.clear()
    second = Runner(settings, backend=SimulatedBackend(LANDSCAPE, workers=WORKERS))
    assert second.recover() == len(left)
    assert statements.matching(r"max\(ds_trial_runs.finished_at\)") == 1
    # every left trial re-enqueued and failed in one transaction, a few statements for all:
    # only SQLite's INSERT of a trial returning its id goes row by row (PostgreSQL's is one)
    rows = statements.matching(r"^INSERT INTO trials ")
    assert rows <= WORKERS
    assert statements.total() - rows <= 48, statements.seen.most_common(12)  # measured 45
    assert (
        statements.matching(r"^INSERT INTO trial_user_attributes") == 2
    )  # the retries', the lost trials'
    assert statements.matching(r"^UPDATE trials SET state") == 1
    second.run(poll_s=0, timeout_s=120)
    assert len(counted(study_of(url, job))) == N_TRIALS


def test_a_runner_killed_before_a_trials_run_row_leaves_it_to_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run row is written once an asked trial is known to train: a runner stopped after
    the ask and before that row (here, while pricing its 20th trial) leaves the trial
    RUNNING with no row, and the next runner re-enqueues it as any trial left running. The
    job ends with exactly n_trials counted, none lost or counted twice."""

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings, Session = setup(url, max_concurrent_trials=64)
    job = submit(Session, settings, job_spec())
    priced = 0
    real = runner_module.price_candidate  # type: ignore[attr-defined]

    def dies_at_the_20th(*args: Any, **kwargs: Any) -> Any:
        nonlocal priced
        priced += 1
        if priced == 20:
            raise Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "price_candidate", dies_at_the_20th)
    first = Runner(settings, backend=SimulatedBackend(LANDSCAPE, workers=WORKERS))
    with pytest.raises(Stop):
        first.run(poll_s=0, timeout_s=120)
    first.engine.dispose()
    monkeypatch.setattr(runner_module, "price_candidate", real)
    study = study_of(url, job)
    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    with Session() as s:
        rows = set(s.scalars(select(TrialRun.trial_number).where(TrialRun.job_id == job.id)))
    no_row = [t.number for t in running if t.number not in rows]
    assert len(no_row) == 1  # the one being priced
    second = Runner(settings, backend=SimulatedBackend(LANDSCAPE, workers=WORKERS))
    second.run(poll_s=0, timeout_s=120)
    trials = study_of(url, job).get_trials()
    assert len(counted(study_of(url, job))) == N_TRIALS
    lost = [t for t in trials if t.user_attrs.get(TrialAttr.LOST)]
    assert no_row[0] in {t.number for t in lost}
    retries = [t.user_attrs.get(TrialAttr.RETRY_OF) for t in trials]
    assert sorted(n for n in retries if n is not None) == sorted(t.number for t in lost)


def test_a_refused_batch_still_records_the_other_trials(tmp_path: Path) -> None:
    """The trials asked in one pass are recorded together at its end; should that write be
    refused (here one trial was finished by another writer meanwhile), the others are
    still recorded, one at a time, with their run rows and attributes, and nothing is left
    unrecorded. (The refusal once committed half the batch's parameters through Optuna's
    own check, so the fallback's writes hit them and were silently dropped.)"""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings, Session = setup(url, max_concurrent_trials=64)
    job = submit(Session, settings, job_spec())
    runner = Runner(settings, backend=SimulatedBackend(LANDSCAPE, workers=WORKERS))
    active = runner.active(job)
    flights = [runner.ask(job.id, active) for _ in range(3)]
    assert all(f is not None for f in flights) and len(runner.flights.unrecorded) == 3
    finished = flights[1]
    assert finished is not None
    optuna_storage_of = study_of(url, job)._storage
    optuna_storage_of.set_trial_state_values(finished.trial._trial_id, optuna.trial.TrialState.FAIL)
    runner.outcomes.record_asked()
    assert runner.flights.unrecorded == []
    kept = [f for f in flights if f is not finished]
    assert all(f is not None and f in runner.flights and f.run_id > 0 for f in kept)
    with Session() as s:
        rows = set(s.scalars(select(TrialRun.trial_number).where(TrialRun.job_id == job.id)))
    assert {f.trial.number for f in kept if f is not None} <= rows
    fresh = {t.number: t for t in study_of(url, job).get_trials()}
    for f in kept:
        assert f is not None and TrialAttr.COSTS in fresh[f.trial.number].user_attrs
