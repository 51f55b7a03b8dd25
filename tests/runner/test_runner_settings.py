"""A trial trained at every setting of a `tune` grid and every seed, on real components (a
local Ray, the built-in corpus, SQLite): what it records, the progress readers see while it
runs, a setting that diverges, and a runner killed in the middle of a trial's runs."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select

from nas_service.jobs import submit
from nas_service.results.cache import ResultsCache
from nas_service.runner.loop import Runner
from nas_service.runner.recovery import record_event, recover_job
from nas_service.spec import TRAINING_AXES
from nas_service.store import Job, TrialRun
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrainRun, TrialAttr
from tests.support import procs
from tests.support.jobs import TINY, counted, setup, study_of

ROOT = Path(__file__).resolve().parents[2]

LRS = [0.003, 0.01]
TUNED = TINY | {"name": "tuned", "n_trials": 2, "seeds": 2, "tune": {"lr": LRS}}
#: The order the runs of a TUNED trial are trained in: setting-major, seeds 0, 1.
PLAN = [(lr, k) for lr in LRS for k in range(2)]


def _runs(Session: Any, job_id: str) -> dict[int, list[TrialRun]]:
    """The job's run rows per trial, in the order they were made."""
    with Session() as s:
        rows = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job_id)))
    out: dict[int, list[TrialRun]] = {}
    for r in sorted(rows, key=lambda r: r.id):
        out.setdefault(r.trial_number, []).append(r)
    return out


def _plan_of(train: list[TrainRun]) -> list[tuple[float, int]]:
    return [(e["setting"]["lr"], e["seed"]) for e in train]


@dataclass
class TunedJob:
    url: str
    Session: Any
    job: Job
    seen: list[dict[int, tuple[str, list[tuple[float, int]]]]]  # per poll: number -> state, runs


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> TunedJob:
    """TUNED run to completion while another thread reads the job's table as the API does
    (`ResultsCache` keyed on the job's run rows, read afresh at every poll)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('tuned') / 'depthscope.db'}"
    settings, Session = setup(url)
    job = submit(Session, settings, TUNED)
    cache = ResultsCache(optuna_storage(url), fresh_s=0.0, job_runs=True)
    seen: list[dict[int, tuple[str, list[tuple[float, int]]]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            table = cache.get(job.study_name, ["val_loss"], job_id=job.id)
            seen.append({r.number: (str(r.state), _plan_of(r.train)) for r in table.rows})
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        Runner(settings).run(timeout_s=300)
    finally:
        stop.set()
        thread.join(timeout=30)
    return TunedJob(url, Session, job, seen)


def _check_settings(t: FrozenTrial, seeds: int) -> tuple[int, list[float | None]]:
    """Recompute a completed trial's per-setting losses from its `train` runs, check its
    `settings`, `setting`, value and seed statistics against them; the chosen index and
    the means."""
    train = t.user_attrs["train"]
    table = t.user_attrs["settings"]
    means: list[float | None] = []
    for entry in table:
        runs = [e for e in train if e["setting"] == entry["setting"]]
        losses = [None] * seeds
        for e in runs:
            if e["status"] == "completed":
                losses[e["seed"]] = e["final_val_loss"]
        assert entry["losses"] == pytest.approx(losses)
        mean = statistics.fmean(losses) if None not in losses else None  # type: ignore[arg-type]
        assert entry["mean"] == (None if mean is None else pytest.approx(mean))
        means.append(mean)
    finite = [(m, i) for i, m in enumerate(means) if m is not None]
    best_mean, best = min(finite)
    assert t.user_attrs["setting"] == table[best]["setting"]
    assert t.values[0] == pytest.approx(best_mean)
    assert t.user_attrs["val_loss_seeds"]["values"] == pytest.approx(table[best]["losses"])
    assert t.user_attrs["val_loss_seeds"]["mean"] == pytest.approx(best_mean)
    seed0 = next(e for e in train if e["setting"] == table[best]["setting"] and e["seed"] == 0)
    assert t.user_attrs["curve"][-1][3] == pytest.approx(seed0["final_val_loss"])
    return best, means


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_every_setting_is_trained_at_every_seed(tuned: TunedJob) -> None:
    with tuned.Session() as s:
        assert s.get(Job, tuned.job.id).status == "completed"
    trials = counted(study_of(tuned.url, tuned.job))
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    runs = _runs(tuned.Session, tuned.job.id)
    for t in trials:
        train = t.user_attrs["train"]
        assert _plan_of(train) == PLAN
        assert all(e["status"] == "completed" for e in train)
        for e in train:  # every axis's effective value; only the tuned one varies
            assert set(e["setting"]) == set(TRAINING_AXES)
            assert {k: v for k, v in e["setting"].items() if k != "lr"} == {
                k: v for k, v in train[0]["setting"].items() if k != "lr"
            }
        # different seeds and different settings: different runs
        assert len({e["final_val_loss"] for e in train}) == 4
        table = t.user_attrs["settings"]
        assert [e["setting"]["lr"] for e in table] == LRS
        assert all(len(e["losses"]) == 2 for e in table)
        _check_settings(t, seeds=2)
        # one row per run, each closed as its run finished; the last carries the outcome
        rows = runs[t.number]
        assert [r.reason for r in rows] == ["run 1 of 4", "run 2 of 4", "run 3 of 4", ""]
        assert [r.state for r in rows] == ["completed"] * 4 and {r.attempt for r in rows} == {1}
        for a, b in itertools.pairwise(rows):  # the next run's row opened, then this one closed
            assert a.finished_at is not None and b.finished_at is not None
            assert b.started_at <= a.finished_at <= b.finished_at


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_readers_see_each_run_as_it_finishes(tuned: TunedJob) -> None:
    """The table a reader gets while a trial runs (refreshed only when the job's run rows
    change) shows its finished runs one by one, a prefix of the plan each time."""
    final = {
        t.number: _plan_of(t.user_attrs["train"]) for t in study_of(tuned.url, tuned.job).trials
    }
    shown: dict[int, list[int]] = {}  # trial -> how many runs the table showed, poll by poll
    for poll in tuned.seen:
        for number, (state, plan) in poll.items():
            if state == "running":
                assert plan == final[number][: len(plan)]
                shown.setdefault(number, []).append(len(plan))
    assert shown, "no poll saw a trial running"
    for counts in shown.values():
        # grows; all 4 only in the instant between the trial's last attributes and its
        # state (Optuna stores them apart, and a finished trial's attributes are frozen), a
        # moment a reader refreshed by the other trial's rows can catch
        assert counts == sorted(counts) and max(counts) <= 4
    assert {1, 2, 3} <= {n for counts in shown.values() for n in counts}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_setting_that_diverges_is_given_up(sqlite_url: str) -> None:
    """lr 50 without warm-up explodes at once (the loss passes divergence_factor · ln 256):
    that setting's other seed is skipped, and the trial goes on with the next setting; a
    trial whose every setting diverges is diverged."""
    settings, Session = setup(sqlite_url)
    training = TINY["training"] | {"warmup_frac": 0.0}
    half = TINY | {
        "name": "half",
        "n_trials": 1,
        "seeds": 2,
        "training": training,
        "tune": {"lr": [50.0, 0.003]},
    }
    every = half | {"name": "every", "tune": {"lr": [50.0, 80.0]}}
    a = submit(Session, settings, half)
    b = submit(Session, settings, every)
    Runner(settings).run(timeout_s=300)
    with Session() as s:
        assert {s.get(Job, a.id).status, s.get(Job, b.id).status} == {"completed"}

    [t] = counted(study_of(sqlite_url, a))
    assert t.state == TrialState.COMPLETE and t.user_attrs["outcome"] == "completed"
    train = t.user_attrs["train"]
    assert _plan_of(train) == [(50.0, 0), (0.003, 0), (0.003, 1)]  # (50, seed 1) skipped
    assert [e["status"] for e in train] == ["diverged", "completed", "completed"]
    table = t.user_attrs["settings"]
    assert table[0]["losses"] == [None, None] and table[0]["mean"] is None
    best, means = _check_settings(t, seeds=2)
    assert best == 1 and means[1] is not None
    rows = _runs(Session, a.id)[t.number]
    assert [r.state for r in rows] == ["diverged", "completed", "completed"]
    assert str(rows[0].reason).startswith("run 1 of 4: training loss")
    assert [r.reason for r in rows[1:]] == ["run 3 of 4", ""]

    [u] = counted(study_of(sqlite_url, b))
    assert u.state == TrialState.FAIL and u.user_attrs["outcome"] == "diverged"
    assert _plan_of(u.user_attrs["train"]) == [(50.0, 0), (80.0, 0)]
    assert [e["mean"] for e in u.user_attrs["settings"]] == [None, None]
    assert u.user_attrs["reason"].startswith("every one of 2 settings diverged")
    assert [r.state for r in _runs(Session, b.id)[u.number]] == ["diverged", "diverged"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_runner_killed_between_runs_of_a_trial_resumes_without_loss(
    sqlite_url: str, tmp_path: Path
) -> None:
    """SIGKILL to a runner whose only trial has finished some of its runs: the next runner
    re-enqueues that trial once (its finished runs' rows stay as they were, its open row is
    closed as lost, and they are no progress: the retry is suspect), and the job ends with
    exactly n_trials counted, each with all its runs."""
    settings, Session = setup(sqlite_url)
    spec = TUNED | {"name": "crash", "max_concurrent": 1, "budget": {"tokens": 4 * 32 * 40}}
    job = submit(Session, settings, spec)
    env = os.environ | {"DEPTHSCOPE_DATABASE_URL": sqlite_url, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "nas_service.runner", "--timeout", "300"]
    log = (tmp_path / "runner1.log").open("w")
    first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until a trial's run is closed and the next open
            rows = _runs(Session, job.id).values()
            if any(1 < len(r) < 4 and r[-1].state == "running" for r in rows):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the first runner never had a trial part-way through its runs")
    finally:
        procs.kill_session(first)  # its group and every descendant (its Ray's workers too)
    study = study_of(sqlite_url, job)
    assert not counted(study)
    left = {
        t.number: len(t.user_attrs["train"]) for t in study.get_trials(states=(TrialState.RUNNING,))
    }
    assert len(left) == 1
    second = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400, start_new_session=True
    )
    assert second.returncode == 0, second.stderr[-3000:]
    study = study_of(sqlite_url, job)
    trials = counted(study)
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        assert _plan_of(t.user_attrs["train"]) == PLAN
        _check_settings(t, seeds=2)
    lost = [t for t in study.trials if t.user_attrs.get(TrialAttr.LOST)]
    assert {t.number for t in lost} == set(left)
    [retry] = [t for t in trials if "ds_retry_of" in t.user_attrs]
    assert retry.user_attrs["ds_retry_of"] in left
    assert retry.user_attrs["ds_suspect"] == 1  # its own finished runs were not progress
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
    runs = _runs(Session, job.id)
    [(number, done)] = left.items()
    states = [r.state for r in runs[number]]
    assert states == ["completed"] * done + ["lost"]  # the finished runs kept, one lost
    assert all(r.state != "running" for rows in runs.values() for r in rows)
    for t in trials:
        assert [r.state for r in runs[t.number]] == ["completed"] * 4


def test_runs_finished_on_the_way_are_no_progress_for_recovery(sqlite_url: str) -> None:
    """Recovery's poison rule counts a trial *finishing* as progress: the closed rows of runs
    of trials still in flight when the runner stopped ("run i of n", each followed by the
    next run's open row) are not, the row that ended a told trial is."""
    settings, Session = setup(sqlite_url)
    job = submit(Session, settings, TUNED | {"name": "rows"})
    study = study_of(sqlite_url, job)
    with Session.begin() as s:
        row = s.get(Job, job.id)
        row.status = "running"
    left = [study.ask(), study.ask()]
    time.sleep(0.01)  # every row below closes after both started
    with Session.begin() as s:
        for t in left:  # one run done, the next one open
            now = dt.datetime.now(dt.UTC)
            s.add(
                TrialRun(
                    job_id=job.id,
                    trial_number=t.number,
                    params={},
                    state="completed",
                    reason="run 1 of 4",
                    finished_at=now,
                )
            )
            s.add(TrialRun(job_id=job.id, trial_number=t.number, params={}))
    with Session() as s:
        row = s.get(Job, job.id)
        s.expunge(row)
    assert recover_job(row, study, Session, 3, record_event(Session)) == 2
    retries = [t for t in study.get_trials() if "ds_retry_of" in t.user_attrs]
    assert sorted(t.user_attrs["ds_retry_of"] for t in retries) == [t.number for t in left]
    assert [t.user_attrs["ds_suspect"] for t in retries] == [1, 1]  # no progress
    runs = _runs(Session, job.id)
    assert [[r.state for r in runs[t.number]] for t in left] == [["completed", "lost"]] * 2

    # the retries run again; one trial ends (told, its last row closed) before the stop
    again = [study.ask(), study.ask()]
    assert {t.number for t in again} == {t.number for t in retries}
    done = study.ask()
    time.sleep(0.01)
    with Session.begin() as s:
        now = dt.datetime.now(dt.UTC)
        for t in again:
            s.add(TrialRun(job_id=job.id, trial_number=t.number, params={}))
        s.add(
            TrialRun(
                job_id=job.id,
                trial_number=done.number,
                params={},
                state="completed",
                reason="run 1 of 4",
                finished_at=now,
            )
        )
        s.add(
            TrialRun(
                job_id=job.id,
                trial_number=done.number,
                params={},
                state="completed",
                reason="",
                finished_at=now,
            )
        )
    study.tell(done, 1.0)
    assert recover_job(row, study, Session, 3, record_event(Session)) == 2
    second = [
        t
        for t in study.get_trials()
        if t.user_attrs.get("ds_retry_of") in {a.number for a in again}
    ]
    assert [t.user_attrs["ds_suspect"] for t in second] == [0, 0]  # a trial finished
