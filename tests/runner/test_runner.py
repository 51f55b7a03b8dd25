"""Search jobs end to end on real components: Optuna studies in SQLite and PostgreSQL, a real
local Ray, the built-in corpus; constraints, divergence, pruning, a killed worker, and a
runner killed with SIGKILL and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState
from pydantic import SecretStr
from sqlalchemy import select

from cost_model import METRICS
from nas_service.jobs import submit
from nas_service.runner.loop import Runner
from nas_service.settings import ClusterSettings, get_settings
from nas_service.store import Job, JobEvent, TrialRun, make_engine, make_sessionmaker, upgrade
from nas_service.store.records import TrialAttr
from tests.support import procs
from tests.support.jobs import TINY, counted, setup, study_of

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.usefixtures("ray_local"),
]
ROOT = Path(__file__).resolve().parents[2]


def test_job_runs_to_completion(db_url: str) -> None:
    settings, Session = setup(db_url)
    job = submit(Session, settings, TINY)
    Runner(settings).run(timeout_s=300)
    with Session() as s:
        row = s.get(Job, job.id)
        assert row.status == "completed"
        assert [e.kind for e in row.events] == ["submitted", "started", "completed"]
        runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job.id)))
    study = study_of(db_url, job)
    trials = counted(study)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(r.trial_number for r in runs) == sorted(t.number for t in trials)
    assert all(r.state == "completed" and r.attempt == 1 for r in runs)
    for t in trials:
        train = t.user_attrs["train"][0]
        assert t.values[0] == pytest.approx(train["final_val_loss"])
        assert train["tokens_seen"] == 4 * 32 * 16 and train["status"] == "completed"
        assert set(t.user_attrs["costs"]) == set(METRICS)
        assert t.user_attrs["arch"]["n_layers"] == t.params["n_layers"]
        assert len(t.user_attrs["curve"]) == 4
        assert train["corpus"]["name"].startswith("stdlib")


def test_constraints_and_divergence(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    capped = TINY | {
        "name": "capped",
        "constraints": [{"metric": "params", "max": 30_000}],
        "n_trials": 6,
    }
    diverging = TINY | {
        "name": "diverging",
        "training": TINY["training"] | {"lr": 50.0, "warmup_frac": 0.0},
        "n_trials": 2,
    }
    a = submit(Session, settings, capped)
    b = submit(Session, settings, diverging)
    Runner(settings).run(timeout_s=300)  # both jobs at once
    with Session() as s:
        assert {s.get(Job, a.id).status, s.get(Job, b.id).status} == {"completed"}
        trained = {
            r.trial_number for r in s.scalars(select(TrialRun).where(TrialRun.job_id == a.id))
        }
        div_runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == b.id)))
    over = [
        t
        for t in counted(study_of(sqlite_url, a))
        if t.user_attrs.get("outcome") == "over_constraint"
    ]
    assert over, "the space holds candidates over 30k parameters"
    for t in over:
        assert t.state == TrialState.PRUNED
        assert t.user_attrs["costs"]["params"] > 30_000
        assert "over the cap" in t.user_attrs["reason"]
        assert t.number not in trained  # never trained
    diverged = counted(study_of(sqlite_url, b))
    assert len(diverged) == 2
    assert all(
        t.state == TrialState.FAIL and t.user_attrs["outcome"] == "diverged" for t in diverged
    )
    assert all(r.state == "diverged" and r.attempt == 1 for r in div_runs)  # not retried


def test_two_objective_job_prunes_hopeless_candidates(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    spec = TINY | {
        "name": "pareto",
        "objectives": ["val_loss", "params"],
        "pruner": "auto",
        "sampler": "grid",
        "n_trials": 8,
        "space": TINY["space"] | {"n_layers": [1, 2, 3], "d_model": [32, 64, 96], "head_dim": 16},
        "budget": {"tokens": 4 * 32 * 40},
        "training": TINY["training"] | {"n_evals": 8},
    }
    job = submit(Session, settings, spec)
    Runner(settings).run(timeout_s=400)
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 8
    pruned = [t for t in trials if t.user_attrs.get("outcome") == "pruned"]
    assert pruned, [t.values for t in trials]
    for t in pruned:
        assert "dominates" in t.user_attrs["reason"]
        assert len(t.user_attrs["curve"]) < 8  # stopped before its budget


TRAINING = procs.cmdline_contains("ray::train_streaming")  # a Ray worker running the task


def _training_workers() -> list[Any]:
    """The Ray workers training now, among the descendants of this test process only: the
    module's `ray.init` made its raylet (and so every worker) our descendant."""
    return procs.find_in_tree(None, TRAINING)


def test_a_killed_worker_is_retried(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    spec = TINY | {
        "name": "killed",
        "n_trials": 2,
        "max_concurrent": 1,
        "budget": {"tokens": 4 * 32 * 400},
    }
    job = submit(Session, settings, spec)
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            with Session() as s:
                running = s.scalars(select(TrialRun).where(TrialRun.job_id == job.id)).first()
            workers = _training_workers() if running else []
            if workers:
                time.sleep(1.0)  # let it train a little
                victim = workers[0]
                if victim.is_running():
                    assert os.getsid(victim.pid) == os.getsid(0)  # in this test's session
                    victim.send_signal(signal.SIGKILL)
                    killed.append(victim.pid)
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    Runner(settings).run(timeout_s=400)
    thread.join(timeout=5)
    assert len(killed) == 1  # exactly one worker, and one of ours
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
        runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job.id)))
        retries = list(
            s.scalars(
                select(JobEvent).where(JobEvent.job_id == job.id, JobEvent.kind == "trial_retry")
            )
        )
    assert retries
    assert any(r.attempt == 2 and r.state == "completed" for r in runs)
    assert len(counted(study_of(sqlite_url, job))) == 2


def test_runner_killed_with_sigkill_resumes_without_loss(sqlite_url: str, tmp_path: Path) -> None:
    settings, Session = setup(sqlite_url)
    spec = TINY | {"name": "crash", "n_trials": 6, "budget": {"tokens": 4 * 32 * 60}}
    job = submit(Session, settings, spec)
    env = os.environ | {"DEPTHSCOPE_DATABASE_URL": sqlite_url, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "nas_service.runner", "--timeout", "300"]
    left_running: dict[int, dict[str, Any]] = {}
    # SIGKILL a runner while one trial is done and another trains; a kill that lands just as
    # the training trial finishes (the poll saw it running a moment before) leaves none
    # running and proves nothing: the next runner resumes, and is killed in turn
    for attempt in range(3):
        log = (tmp_path / f"runner{attempt + 1}.log").open("w")
        first = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                study = study_of(sqlite_url, job)
                done = len(counted(study))
                running = len(study.get_trials(states=(TrialState.RUNNING,)))
                if done >= 1 and running >= 1:
                    break
                time.sleep(0.5)
            else:
                pytest.fail("the first runner never had a trial done and one running")
        finally:
            procs.kill_session(first)  # its group and every descendant (its Ray's workers too)
        study = study_of(sqlite_url, job)
        left_running = {t.number: t.params for t in study.get_trials(states=(TrialState.RUNNING,))}
        if left_running:
            break
    assert left_running, "three kills, and none landed while a trial trained"
    second = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400, start_new_session=True
    )
    assert second.returncode == 0, second.stderr[-3000:]
    study = study_of(sqlite_url, job)
    trials = counted(study)
    assert len(trials) == 6  # exactly n_trials counted: none lost, none extra
    lost = [t for t in study.trials if t.user_attrs.get(TrialAttr.LOST)]
    assert {t.number for t in lost} == set(left_running)
    retried = {
        t.user_attrs.get("ds_retry_of"): t.params for t in trials if "ds_retry_of" in t.user_attrs
    }
    assert set(retried) == set(left_running)
    for number, params in left_running.items():  # re-run with the same parameters (those it
        assert params.items() <= retried[number].items()  # had drawn, if killed mid-draw)
        assert set(retried[number]) == {"residual", "n_layers", "d_model"}
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"
        states = [r.state for r in s.scalars(select(TrialRun).where(TrialRun.job_id == job.id))]
    assert states.count("lost") == len(left_running)


def test_seeds_are_averaged_and_their_spread_kept(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    job = submit(Session, settings, TINY | {"name": "seeds", "n_trials": 2, "seeds": 2})
    Runner(settings).run(timeout_s=300)
    for t in counted(study_of(sqlite_url, job)):
        seeds = t.user_attrs["val_loss_seeds"]
        assert len(seeds["values"]) == 2 and len(t.user_attrs["train"]) == 2
        assert seeds["values"][0] != seeds["values"][1]  # different seeds, different runs
        assert t.values[0] == pytest.approx(sum(seeds["values"]) / 2)
        assert seeds["std"] > 0


@pytest.mark.postgres
def test_four_jobs_at_once_on_postgres(postgres_url: str) -> None:
    settings, Session = setup(postgres_url)
    jobs = [
        submit(
            Session,
            settings,
            TINY | {"name": f"j{i}", "n_trials": 3, "max_concurrent": 1, "sampler_seed": i},
        )
        for i in range(4)
    ]
    Runner(settings).run(timeout_s=400)
    with Session() as s:
        assert [s.get(Job, j.id).status for j in jobs] == ["completed"] * 4
        failed = list(s.scalars(select(TrialRun).where(TrialRun.state != "completed")))
    assert failed == []
    for j in jobs:
        assert len(counted(study_of(postgres_url, j))) == 3


def test_cancelling_a_job_stops_its_ray_tasks(sqlite_url: str) -> None:
    from nas_service.jobs import cancel

    settings, Session = setup(sqlite_url)
    job = submit(
        Session,
        settings,
        TINY | {"name": "cancel", "n_trials": 2, "budget": {"tokens": 4 * 32 * 100_000}},
    )
    runner = Runner(settings)
    thread = threading.Thread(target=runner.run, kwargs={"timeout_s": 300}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _training_workers():
        time.sleep(0.2)
    assert _training_workers(), "no training task started"
    cancel(Session, job.id)
    thread.join(timeout=120)
    assert not thread.is_alive()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _training_workers():
        time.sleep(0.2)
    assert not _training_workers()
    with Session() as s:
        assert s.get(Job, job.id).status == "cancelled"
    trials = study_of(sqlite_url, job).trials
    assert trials and all(
        t.state == TrialState.FAIL and t.user_attrs["outcome"] == "cancelled" for t in trials
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_head() -> Iterator[tuple[str, str]]:
    """A separately started Ray cluster (`ray start --head`) with token authentication, in
    its own process session, stopped afterwards by its own process tree (never `ray stop`,
    which would stop every Ray on the machine)."""
    import secrets
    import shutil
    import socket
    import tempfile

    port, token = _free_port(), secrets.token_hex(32)
    temp = tempfile.mkdtemp(prefix="dsray", dir="/tmp")
    env = os.environ | {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
            "--block",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the Ray head did not come up")
        time.sleep(2)
        yield f"127.0.0.1:{port}", token
    finally:
        procs.kill_session(head)
        shutil.rmtree(temp, ignore_errors=True)


def test_job_on_a_separately_started_ray_cluster(
    sqlite_url: str, ray_head: tuple[str, str]
) -> None:
    address, token = ray_head
    upgrade(sqlite_url)
    lab = ClusterSettings(address=address, auth_mode="token", auth_token=SecretStr(token))
    settings = get_settings(
        database_url=sqlite_url, clusters={"local": ClusterSettings(), "lab": lab}
    )
    Session = make_sessionmaker(make_engine(sqlite_url))
    job = submit(Session, settings, TINY | {"name": "lab", "cluster": "lab", "n_trials": 3})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env |= {
        "DEPTHSCOPE_DATABASE_URL": sqlite_url,
        "DEPTHSCOPE_CLUSTERS__LAB__ADDRESS": address,
        "DEPTHSCOPE_CLUSTERS__LAB__AUTH_MODE": "token",
        "DEPTHSCOPE_CLUSTERS__LAB__AUTH_TOKEN": token,
        "DEPTHSCOPE_CLUSTERS__LAB__SHIP_CODE": "true",  # the code travels with the tasks
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    out = subprocess.run(
        [sys.executable, "-m", "nas_service.runner", "--cluster", "lab", "--timeout", "300"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Connected to Ray cluster" in out.stderr
    with Session() as s:
        row = s.get(Job, job.id)
        assert row is not None
        assert row.status == "completed"
        assert "on cluster lab" in next(e.message for e in row.events if e.kind == "started")
    assert len(counted(study_of(sqlite_url, job))) == 3
