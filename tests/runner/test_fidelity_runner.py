"""Multi-fidelity jobs end to end on real components: a local Ray training the candidates on
the built-in corpus, the Optuna study in SQLite, checkpoints in a local artifact store.

A candidate promoted through every rung ends with exactly the training of a straight run
(the same tokens, the same loss bit for bit); only the best 1/η of a rung go on; a job
keeps no checkpoint once it is done; a corrupt checkpoint fails its trial and the job goes
on; a runner stopped while a promoted trial trains resumes it from its rung."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select

from nas_service.api.app import create_app
from nas_service.jobs import submit
from nas_service.runner.loop import Runner
from nas_service.search.fidelity import Result, bracket_of, promotion_order
from nas_service.search.pricing import price_candidate
from nas_service.search.rungs import records
from nas_service.spec import JobSpec, parse_spec
from nas_service.store import Job, JobEvent
from nas_service.store.records import TrialAttr
from tests.support import procs
from tests.support.jobs import TINY, counted, setup, study_of
from workers.contract import TrainSpec
from workers.train import train

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.usefixtures("ray_local"),
]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 27  # each candidate's straight run: 4 × 32 tokens a step
FIDELITY: dict[str, Any] = TINY | {
    "name": "fidelity",
    "budget": {"tokens": 4 * 32 * STEPS},
    "n_trials": 9,
    "fidelity": {"rungs": [1 / 9, 1 / 3, 1], "reduction": 3},
    "training": TINY["training"] | {"schedule": "wsd", "n_evals": 3},
}


def _store_files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


def _drive(runner: Runner, between: Callable[[], bool] = lambda: False, limit: float = 300) -> None:
    """The runner's loop, one schedule and one poll at a time, calling `between` after each
    poll (before the next schedule: the only place promotions happen); stops when the job
    is done or `between` returns True."""
    assert runner.lease.try_acquire()
    runner.backend.connect()
    runner.recover()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        busy = runner.step()
        if not busy and not runner.flights:
            return
        if runner.flights:
            runner.poll(0.2)
        if between():
            return
    raise TimeoutError("the job did not finish")


def _straight_spec(spec: JobSpec, t: FrozenTrial) -> TrainSpec:
    """The trial's candidate as one straight run (what its rungs must add up to)."""
    priced = price_candidate(spec, dict(t.params))
    assert priced.train_spec is not None
    return priced.train_spec


def _rung_losses(trials: list[FrozenTrial], rung: int) -> dict[int, float]:
    return {t.number: r["loss"] for t in trials for r in records(t) if r["rung"] == rung}


def test_a_wsd_job_promotes_the_best_third_and_ends_as_straight_runs(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    job = submit(Session, settings, FIDELITY)
    seen_checkpoints: set[Path] = set()
    seen: dict[str, int] = {"waiting": 0, "training": 0, "eta": 0}

    with TestClient(create_app(settings)) as client:

        def watch() -> bool:
            seen_checkpoints.update(_store_files(store))
            read = client.get(f"/v1/jobs/{job.id}").json()
            for key in ("waiting", "training"):
                seen[key] = max(seen[key], sum(r[key] for r in read["progress"]["rungs"]))
            seen["eta"] += read["eta_s"] is not None
            return False

        _drive(Runner(settings), watch)
    # while it ran, readers saw trials training and waiting at rungs, and an ETA
    assert seen["waiting"] >= 1 and seen["training"] >= 1 and seen["eta"] >= 1
    study = study_of(sqlite_url, job)
    trials = counted(study)
    assert len(trials) == 9 and len(study.trials) == 9  # none lost, none duplicated
    assert seen_checkpoints, "the rungs below the last wrote checkpoints"
    assert _store_files(store) == []  # a finished job keeps none

    # ASHA: every trial trained rung 0; the best ⌊9/3⌋ there (at the end) went on
    rung0 = _rung_losses(trials, 0)
    assert len(rung0) == 9
    best3 = sorted(rung0, key=lambda n: (rung0[n], n))[:3]
    promoted0 = {t.number for t in trials for r in records(t) if r["rung"] == 0 and r["promoted"]}
    assert set(best3) <= promoted0
    assert len(_rung_losses(trials, 1)) == len(promoted0)

    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete, "at least one candidate reached the full budget"
    for t in trials:
        assert t.user_attrs.get(TrialAttr.WAITING) is None or t.state != TrialState.RUNNING
        if t.state == TrialState.PRUNED:
            assert "stopped at rung" in t.user_attrs["reason"]
    spec = parse_spec(job.spec)
    for t in complete:
        assert [r["rung"] for r in records(t)] == [0, 1, 2]
        runs = t.user_attrs[TrialAttr.TRAIN]
        assert [r["rung"] for r in runs] == [0, 1, 2]
        # the main line: 3 + 6 + 18 steps = the straight run's 27; plus a branch per rung
        straight = train(_straight_spec(spec, t))
        assert runs[-1]["steps"] == straight.steps == STEPS
        assert t.values[0] == straight.final_val_loss  # bit for bit
        tokens = sum(r["tokens_seen"] for r in runs)
        assert tokens > straight.tokens_seen  # the decay branches cost a little more

    # what users read: progress per rung, compute against the rungs' plan, rungs per trial
    with TestClient(create_app(settings)) as client:
        read = client.get(f"/v1/jobs/{job.id}").json()
        page = client.get(f"/v1/jobs/{job.id}/trials", params={"limit": 100}).json()
    rungs = read["progress"]["rungs"]
    assert [r["rung"] for r in rungs] == [0, 1, 2]
    assert rungs[0]["reached"] == 9 and rungs[0]["promoted"] == len(promoted0)
    assert rungs[2]["reached"] == len(complete)
    assert all(r["waiting"] == 0 and r["training"] == 0 for r in rungs)
    # the plan: 9 candidates × (1/9 + (1/3 − 1/9)/3 + (1 − 1/3)/9) of a straight run
    per_run = 4 * 32 * STEPS
    assert read["compute"]["budget"] == pytest.approx(9 * per_run * (1 / 9 + 2 / 27 + 2 / 27))
    assert read["compute"]["spent"] == sum(
        r["tokens_seen"] for t in trials for r in t.user_attrs[TrialAttr.TRAIN]
    )
    by_number = {t["number"]: t for t in page["items"]}
    for t in trials:
        shown = by_number[t.number]
        assert [r["rung"] for r in shown["rungs"]] == [r["rung"] for r in records(t)]
        assert all(run["rung"] is not None for run in shown["train"])
        if t.state == TrialState.COMPLETE:  # the main line's evaluations, every 9 steps
            assert [row[0] for row in shown["train"][-1]["curve"]] == [18, 27]


def test_hyperband_brackets_start_later_rungs_and_promote_within_their_bracket(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    spec = FIDELITY | {
        "n_trials": 10,
        "fidelity": FIDELITY["fidelity"] | {"brackets": 2},
    }
    job = submit(Session, settings, spec)
    _drive(Runner(settings))
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 10
    parsed = parse_spec(job.spec)
    assert parsed.fidelity is not None
    for t in trials:
        assert records(t)[0]["rung"] == bracket_of(t.number, parsed.fidelity)
    # B = 2, η = 3: 3 of every 5 trials in bracket 0, 2 in bracket 1 (starting at rung 1)
    assert sum(records(t)[0]["rung"] == 1 for t in trials) == 4
    # a bracket's rung-1 results are ranked among themselves only
    for first in (0, 1):
        at1 = {
            t.number: r["loss"]
            for t in trials
            if records(t)[0]["rung"] == first
            for r in records(t)
            if r["rung"] == 1
        }
        went_on = {
            t.number
            for t in trials
            if records(t)[0]["rung"] == first
            for r in records(t)
            if r["rung"] == 1 and r["promoted"]
        }
        best = sorted(at1, key=lambda n: (at1[n], n))[: len(at1) // 3]
        assert set(best) <= went_on
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert t.values[0] == train(_straight_spec(parsed, t)).final_val_loss
    assert _store_files(store) == []


def test_two_objectives_promote_by_non_dominated_rank(sqlite_url: str, tmp_path: Path) -> None:
    """The costs are known before training: a rung's results are ranked by their
    non-dominated rank over (loss at the rung, training memory), then loss, then number."""
    settings, Session = setup(sqlite_url, artifact_store=str(tmp_path / "artifacts"))
    spec = FIDELITY | {"objectives": ["val_loss", "train_memory_bytes"]}
    job = submit(Session, settings, spec)
    _drive(Runner(settings))
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 9
    at0 = [
        (t, r) for t in trials for r in records(t) if r["rung"] == 0
    ]  # every trial's rung-0 record, with its objective vector
    assert len(at0) == 9
    for t, r in at0:
        assert r["values"] == [r["loss"], t.user_attrs["costs"]["train_memory_bytes"]]
    order = promotion_order([Result(t.number, r["loss"], tuple(r["values"])) for t, r in at0])
    promoted = {t.number for t, r in at0 if r["promoted"]}
    assert {r.number for r in order[:3]} <= promoted
    # a trial that reached the full budget is told both objectives
    assert any(t.state == TrialState.COMPLETE and len(t.values) == 2 for t in trials)


def test_every_setting_and_seed_of_a_rung_resumes_its_own_checkpoint(
    sqlite_url: str, tmp_path: Path
) -> None:
    """With a per-shape grid and seeds a rung trains every setting at every seed, each from
    its own checkpoint; the rung's loss is the best setting's mean over seeds."""
    settings, Session = setup(sqlite_url, artifact_store=str(tmp_path / "artifacts"))
    spec = FIDELITY | {"seeds": 2, "tune": {"lr": [0.003, 0.01]}}
    job = submit(Session, settings, spec)
    _drive(Runner(settings))
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 9
    parsed = parse_spec(job.spec)
    for t in trials:
        runs = t.user_attrs[TrialAttr.TRAIN]
        for rec in records(t):
            at = [r for r in runs if r["rung"] == rec["rung"]]
            assert len(at) == 4  # 2 settings × 2 seeds
            means = [
                sum(r["final_val_loss"] for r in at if r["setting"]["lr"] == lr) / 2
                for lr in (0.003, 0.01)
            ]
            assert rec["loss"] == pytest.approx(min(means))
        if t.state == TrialState.COMPLETE:  # each (setting, seed) ends as its straight run
            straight = _straight_spec(parsed, t)
            for r in [r for r in runs if r["rung"] == 2]:
                run = straight.replace(lr=r["setting"]["lr"], seed=r["seed"])
                assert r["final_val_loss"] == train(run).final_val_loss


def test_retrain_under_cosine_trains_each_rung_from_scratch(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    spec = FIDELITY | {
        "fidelity": FIDELITY["fidelity"] | {"reuse": "retrain"},
        "training": TINY["training"] | {"n_evals": 3},
    }
    job = submit(Session, settings, spec)
    _drive(Runner(settings))
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 9
    assert not store.exists() or _store_files(store) == []  # retraining keeps no checkpoint
    with Session() as s:  # the job says how its rungs reuse work
        started = s.scalars(
            select(JobEvent.message).where(JobEvent.job_id == job.id, JobEvent.kind == "started")
        ).one()
    assert "each promotion retrains from scratch" in started
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete
    for t in complete:
        runs = t.user_attrs[TrialAttr.TRAIN]
        # every rung a run of its own share of the budget, from step 0
        assert [r["steps"] for r in runs] == [3, 9, STEPS]
        assert sum(r["tokens_seen"] for r in runs) == (3 + 9 + STEPS) * 4 * 32
        assert t.values[0] == train(_straight_spec(parse_spec(job.spec), t)).final_val_loss


def test_a_corrupt_checkpoint_fails_its_trial_and_the_job_goes_on(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    job = submit(Session, settings, FIDELITY)

    def corrupt() -> bool:
        for path in _store_files(store):
            if not path.name.startswith(".") and ".tmp" not in path.name:
                path.write_bytes(b"not a checkpoint")
        return False

    _drive(Runner(settings), corrupt)
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 9
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert failed, "every promotion read a corrupt checkpoint"
    for t in failed:
        assert "checkpoint" in t.user_attrs["reason"]
        assert len(records(t)) == 1  # its rung 0 is kept
    assert not any(t.state == TrialState.COMPLETE for t in trials)
    assert _store_files(store) == []


def test_a_runner_stopped_while_a_promoted_trial_trains_resumes_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    job = submit(Session, settings, FIDELITY)
    first = Runner(settings)

    def promoted_in_flight() -> bool:
        return any(f.rung > 0 for f in first.flights)

    _drive(first, promoted_in_flight)
    lost = {f.trial.number for f in first.flights if f.rung > 0}
    unstarted = {f.trial.number for f in first.flights if f.rung == 0}  # no rung done yet
    assert lost
    first.abandon()  # as a runner that dies: nothing told
    first.lease.release()

    _drive(Runner(settings))  # recovery, then the job to its end
    study = study_of(sqlite_url, job)
    trials = counted(study)
    # a promoted trial is resumed, never re-enqueued; a rung-0 trial in flight with no rung
    # done is re-enqueued as lost (recovery's rule for any trial with nothing kept), and its
    # parameters are trained again under a new number
    requeued = [t for t in study.trials if t.user_attrs.get(TrialAttr.LOST)]
    assert {t.number for t in requeued} <= unstarted
    assert not lost & {t.number for t in requeued}
    assert all(not records(t) for t in requeued)
    for t in requeued:
        assert any(u.number > t.number and u.params == t.params for u in trials)
    assert len(trials) == 9 and len(study.trials) == 9 + len(requeued)
    spec = parse_spec(job.spec)
    for t in trials:
        if t.number in lost:
            assert len(records(t)) >= 2  # the rung it was lost in was trained again
        if t.state == TrialState.COMPLETE:
            assert t.values[0] == train(_straight_spec(spec, t)).final_val_loss
        rungs = [r["rung"] for r in t.user_attrs[TrialAttr.TRAIN]]
        assert rungs == sorted(rungs) and len(rungs) == len(set(rungs))  # no rung twice
        assert math.isfinite(t.user_attrs[TrialAttr.RUNGS][-1]["loss"])
    assert _store_files(store) == []


def test_a_runner_sigkilled_while_a_promoted_trial_trains_resumes_it_from_its_checkpoint(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The same with a real process: the runner SIGKILLed (its session: its Ray too) while
    a promoted trial trains a later rung, then a second runner to the end."""
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    spec = FIDELITY | {"name": "fidelity-crash", "budget": {"tokens": 4 * 32 * 270}}
    job = submit(Session, settings, spec)
    env = os.environ | {
        "DEPTHSCOPE_DATABASE_URL": sqlite_url,
        "DEPTHSCOPE_ARTIFACT_STORE": str(store),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    cmd = [sys.executable, "-m", "nas_service.runner", "--timeout", "300"]
    log = (tmp_path / "runner1.log").open("w")
    first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            study = study_of(sqlite_url, job)
            training = [
                t
                for t in study.get_trials(states=(TrialState.RUNNING,))
                if records(t) and t.user_attrs.get(TrialAttr.WAITING) is None
            ]
            if training:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the first runner never promoted a trial")
    finally:
        procs.kill_session(first)
    study = study_of(sqlite_url, job)
    lost = {
        t.number
        for t in study.get_trials(states=(TrialState.RUNNING,))
        if records(t) and t.user_attrs.get(TrialAttr.WAITING) is None
    }
    assert lost
    second = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400, start_new_session=True
    )
    assert second.returncode == 0, second.stderr[-3000:]
    study = study_of(sqlite_url, job)
    trials = counted(study)
    assert len(trials) == 9
    # a trial lost in its first rung has no checkpoint: it is re-enqueued as before (lost,
    # not counted); one lost in a later rung is resumed, never re-enqueued
    requeued = [t for t in study.trials if t.user_attrs.get(TrialAttr.LOST)]
    assert len(study.trials) == 9 + len(requeued)
    assert not lost & {t.number for t in requeued}
    assert all(not records(t) for t in requeued)
    parsed = parse_spec(job.spec)
    for t in trials:
        rungs = [r["rung"] for r in t.user_attrs[TrialAttr.TRAIN]]
        assert rungs == sorted(rungs) and len(rungs) == len(set(rungs))
        if t.number in lost:
            assert len(records(t)) >= 2
        if t.state == TrialState.COMPLETE:
            assert t.values[0] == train(_straight_spec(parsed, t)).final_val_loss  # bit for bit
    assert _store_files(store) == []
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
