"""Faults stay where they happen: a poisoned trial or job fails alone while the others go on;
one runner per cluster; a runner whose service died stops; a cancel while no runner is alive
is concluded by the next runner; workers see none of the service's secrets; a job no node
can run is failed with the reason. Real Ray, real runner processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.jobs import cancel, submit
from nas_service.runner.loop import Runner
from nas_service.search.study import create_study
from nas_service.spec import parse_spec
from nas_service.store import Job, JobEvent, RunnerLease, TrialRun
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrialAttr
from tests.support import jobs as jobkit
from tests.support.jobs import counted, setup, study_of
from tests.support.procs import kill_session

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]

TINY: dict[str, Any] = jobkit.TINY | {
    "space": {"n_layers": [1, 2], "d_model": [32, 64], "head_dim": 16, "variants": ["baseline"]},
    "training": jobkit.TINY["training"] | {"n_evals": 2},
}


def events(Session: Any, job_id: str, kind: str) -> list[JobEvent]:
    with Session() as s:
        return list(
            s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind))
        )


def stored_job(Session: Any, url: str, spec: dict[str, Any]) -> Job:
    """A job row written as an older version (or a hand edit) could have stored it: the spec
    is not validated again here. The runner must cope with whatever the table holds."""
    job_id = str(uuid.uuid4())
    study_name = f"depthscope-{job_id}"
    create_study(parse_spec(TINY), optuna_storage(url), study_name)
    with Session.begin() as s:
        job = Job(
            id=job_id, name="stored", spec=spec, study_name=study_name, n_trials=spec["n_trials"]
        )
        s.add(job)
    return job


# -- one bad job or trial, the others go on -----------------------------------------------------
def test_poisoned_jobs_and_trials_fail_alone(ray_local: None, sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url, max_job_errors=3)
    healthy = submit(Session, settings, TINY | {"name": "healthy"})
    # 1. a stored spec that no longer validates: its budget holds a NaN
    nan = stored_job(
        Session, sqlite_url, TINY | {"cluster": "local", "budget": {"flops": [1e9, float("nan")]}}
    )
    # 2. one trial outside the space (enqueued by hand) in an otherwise good job
    one_bad = submit(Session, settings, TINY | {"name": "one-bad", "n_trials": 3})
    study_of(sqlite_url, one_bad).enqueue_trial({"residual": "no_such_variant", "n_layers": 1})
    # 3. every trial poisoned: the job fails after max_job_errors, not trial after trial
    all_bad = submit(Session, settings, TINY | {"name": "all-bad", "n_trials": 6})
    for _ in range(6):
        study_of(sqlite_url, all_bad).enqueue_trial({"residual": "bogus", "n_layers": 1})

    Runner(settings).run(timeout_s=300)

    with Session() as s:
        status = {
            j.id: (s.get(Job, j.id).status, s.get(Job, j.id).error)
            for j in (healthy, nan, one_bad, all_bad)
        }
    assert status[healthy.id] == ("completed", None)
    assert len(counted(study_of(sqlite_url, healthy))) == 4
    assert status[nan.id][0] == "failed"
    assert "stored spec is no longer valid" in status[nan.id][1]
    assert "budget.flops" in status[nan.id][1]
    assert events(Session, nan.id, "failed")
    assert status[one_bad.id] == ("completed", None)
    trials = counted(study_of(sqlite_url, one_bad))
    assert len(trials) == 3
    bad = [t for t in trials if t.user_attrs.get("outcome") == "failed"]
    assert len(bad) == 1 and "could not start this trial" in bad[0].user_attrs["reason"]
    assert events(Session, one_bad.id, "trial_failed")
    assert status[all_bad.id][0] == "failed"
    assert status[all_bad.id][1].startswith("3 errors while running its trials")
    assert len(events(Session, all_bad.id, "runner_error")) == 2
    failed = [t for t in study_of(sqlite_url, all_bad).trials if t.state == TrialState.FAIL]
    assert len(failed) == 3  # stopped at the third error, not six


def test_a_job_no_node_can_run_fails_with_the_reason(ray_local: None, sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    spec = TINY | {"name": "wide", "training": TINY["training"] | {"threads": 64}}
    job = submit(Session, settings, spec)
    start = time.monotonic()
    Runner(settings).run(timeout_s=120)
    assert time.monotonic() - start < 60
    with Session() as s:
        row = s.get(Job, job.id)
        assert row.status == "failed"
        assert "training.threads" in row.error and "64 CPUs" in row.error
    assert events(Session, job.id, "failed")
    assert study_of(sqlite_url, job).trials == []


def test_worker_errors_reach_users_as_one_clean_line(ray_local: None) -> None:
    import ray

    from nas_service.runner.failures import clean, describe
    from workers.data import CorpusError

    @ray.remote(max_retries=0)
    def fails() -> None:
        raise CorpusError("corpus", "plays.txt holds no tokens")

    with pytest.raises(Exception) as info:
        ray.get(fails.remote())
    assert describe(info.value) == "corpus: plays.txt holds no tokens"
    noisy = "\x1b[36mray::train_streaming()\x1b[39m (pid=4242, ip=10.1.2.3) failed\nTraceback"
    assert clean(noisy) == "ray::train_streaming() failed"
    assert "10.1.2.3" not in clean("worker 10.1.2.3:6379 died")


# -- the runner's own process ---------------------------------------------------------------------
def runner_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "nas_service.runner", *extra]


def runner_env(url: str, **extra: str) -> dict[str, str]:
    return os.environ | {
        "DEPTHSCOPE_DATABASE_URL": url,
        "DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS": "2",
        "DEPTHSCOPE_RUNNER_LEASE_S": "3",
        "RAY_USAGE_STATS_ENABLED": "0",
        **extra,
    }


def run_runner_until_idle(url: str, timeout: float = 120) -> None:
    """`depthscope runner` in a session of its own until every job is done; it must succeed."""
    out = subprocess.run(
        runner_cmd("--timeout", str(timeout)),
        env=runner_env(url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 80,
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def start_runner(
    url: str, log: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out = log.open("w")
    return subprocess.Popen(
        runner_cmd(*extra),
        env=runner_env(url, **(env or {})),
        cwd=ROOT,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )


def wait_for(condition: Any, timeout: float, what: str, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def running_trials(url: str, job: Job) -> list[optuna.trial.FrozenTrial]:
    return study_of(url, job).get_trials(states=(TrialState.RUNNING,))


def job_status(Session: Any, job_id: str) -> str:
    with Session() as s:
        return str(s.get(Job, job_id).status)


def open_run(Session: Any, number: int) -> bool:
    with Session() as s:  # a fresh session: a long-lived one would keep reading one snapshot
        return (
            s.scalar(
                select(TrialRun).where(TrialRun.trial_number == number, TrialRun.state == "running")
            )
            is not None
        )


def test_a_trial_that_keeps_stopping_the_runner_is_not_retried_forever(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings, Session = setup(sqlite_url, max_trial_recoveries=3)
    spec = TINY | {"name": "crashy", "n_trials": 1, "budget": {"tokens": 4 * 32 * 100_000}}
    job = submit(Session, settings, spec)
    for number in range(3):  # the runner dies each time while the candidate trains, alone
        proc = start_runner(sqlite_url, tmp_path / f"runner{number}.log", "--forever")
        try:
            wait_for(lambda n=number: open_run(Session, n), 120, f"trial {number} to train")
        finally:
            kill_session(proc)
    run_runner_until_idle(sqlite_url)
    study = study_of(sqlite_url, job)
    trials = counted(study)
    assert len(trials) == 1  # the poisoned candidate counts: the job ends, exactly n_trials
    assert trials[0].state == TrialState.FAIL and trials[0].number == 2
    assert "poisoned: the runner stopped 3 times in a row" in trials[0].user_attrs["reason"]
    lost = [t for t in study.trials if t.user_attrs.get(TrialAttr.LOST)]
    assert [t.number for t in lost] == [0, 1]
    assert all(t.params == trials[0].params for t in lost)  # one candidate throughout
    assert study.get_trials(states=(TrialState.WAITING, TrialState.RUNNING)) == []
    assert events(Session, job.id, "trial_poisoned")
    with Session() as s:
        assert s.get(Job, job.id).status == "completed"


def test_one_runner_per_cluster(sqlite_url: str, tmp_path: Path) -> None:
    settings, Session = setup(sqlite_url)
    spec = TINY | {"name": "shared", "n_trials": 6, "budget": {"tokens": 4 * 32 * 150}}
    job = submit(Session, settings, spec)
    # a lease of 10 s (renewed every 3.3 s): a training runner beside another test on two
    # busy cores once let a 3 s lease lapse, and the second runner rightly took it over
    lease = {"DEPTHSCOPE_RUNNER_LEASE_S": "10"}
    first = start_runner(sqlite_url, tmp_path / "first.log", "--forever", env=lease)
    second = None
    try:
        wait_for(lambda: running_trials(sqlite_url, job), 120, "the first runner to train")
        second = start_runner(sqlite_url, tmp_path / "second.log", "--forever", env=lease)
        wait_for(
            lambda: "waiting for its lease" in (tmp_path / "second.log").read_text(),
            # a process start beside a training runner (and, under `make test`'s two
            # workers, beside another test): importing torch and Ray took over 120 s once
            300,
            "the second runner to wait",
        )
        with Session() as s:
            lease = s.get(RunnerLease, "local")
            assert lease is not None and f":{first.pid}:" in lease.holder
        kill_session(first)  # the second takes over once the lease expires
        wait_for(lambda: job_status(Session, job.id) == "completed", 240, "the job to finish")
    finally:
        kill_session(first)
        if second is not None:
            kill_session(second)
    assert "lease acquired" in (tmp_path / "second.log").read_text()
    study = study_of(sqlite_url, job)
    assert len(counted(study)) == 6
    with Session() as s:
        runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job.id)))
    # never more than max_concurrent trials training at once: no two runners at work
    spans = [(r.started_at, r.finished_at) for r in runs if r.finished_at is not None]
    for start, _ in spans:
        at_once = sum(1 for a, b in spans if a <= start < b)
        assert at_once <= spec["max_concurrent"]


def test_a_runner_stops_when_its_service_dies(sqlite_url: str, tmp_path: Path) -> None:
    settings, Session = setup(sqlite_url)
    job = submit(
        Session, settings, TINY | {"name": "orphan", "budget": {"tokens": 4 * 32 * 100_000}}
    )
    # a stand-in service: starts the runner as `depthscope serve` does, then waits
    parent = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen({runner_cmd("--forever", "--watch-parent")!r})
        time.sleep(600)
        """
    )
    log = (tmp_path / "service.log").open("w")
    service = subprocess.Popen(
        [sys.executable, "-c", parent],
        env=runner_env(sqlite_url),
        cwd=ROOT,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        wait_for(lambda: running_trials(sqlite_url, job), 120, "the runner to train")
        from tests.support.procs import descendants, wait_gone

        tree = descendants(service.pid)
        os.kill(service.pid, 9)  # the service alone
        service.wait(timeout=10)
        alive = wait_gone(tree, timeout=60)
        assert alive == [], "the runner (or its Ray) outlived its service"
    finally:
        kill_session(service)
    with Session() as s:
        assert s.get(RunnerLease, "local") is None  # given back on the way out


def test_a_cancel_while_no_runner_is_alive_is_concluded(sqlite_url: str, tmp_path: Path) -> None:
    settings, Session = setup(sqlite_url)
    job = submit(
        Session, settings, TINY | {"name": "cancel", "budget": {"tokens": 4 * 32 * 100_000}}
    )
    proc = start_runner(sqlite_url, tmp_path / "runner.log", "--forever")
    try:
        wait_for(lambda: running_trials(sqlite_url, job), 120, "a running trial")
    finally:
        kill_session(proc)
    assert running_trials(sqlite_url, job)
    cancel(Session, job.id)
    run_runner_until_idle(sqlite_url)
    study = study_of(sqlite_url, job)
    assert study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING)) == []
    assert all(t.user_attrs.get("outcome") == "cancelled" for t in study.trials)
    with Session() as s:
        assert s.get(Job, job.id).status == "cancelled"
        assert s.scalars(select(TrialRun).where(TrialRun.state == "running")).all() == []
    assert events(Session, job.id, "concluded")


def test_a_sigterm_after_connecting_ray_reaches_the_runners_handler(tmp_path: Path) -> None:
    """`ray.init` installs a C-level SIGTERM handler in the driver (a stack dump, then the
    signal raised again) over the runner's; racing it, a runner told to stop sometimes died
    without giving back its lease or stopping its Ray. `connect_ray` puts the handler that
    was in place back, so SIGTERM goes straight to the runner's `finally`."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from nas_service.runner.cluster import connect_ray, shutdown_ray
        from nas_service.settings import ClusterSettings

        def stop(*_):
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, stop)
        connect_ray(ClusterSettings(num_cpus=1))
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        finally:
            print("finally ran", flush=True)
            shutdown_ray(local=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert out.returncode == 143, out.stderr[-3000:]
    assert "finally ran" in out.stdout
    assert "SIGTERM received" not in out.stderr  # Ray's dump did not run first


def test_workers_see_none_of_the_service_secrets(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, os, ray
        from nas_service.runner.cluster import connect_ray
        from nas_service.settings import ClusterSettings
        connect_ray(ClusterSettings(num_cpus=1))
        env = ray.get(ray.remote(lambda: dict(os.environ)).remote())
        print(json.dumps({"worker": env, "runner": dict(os.environ)}))
        ray.shutdown()
        """
    )
    secret = "postgresql+psycopg://ds:s3cret@db.internal/ds"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ
        | {
            "DEPTHSCOPE_DATABASE_URL": secret,
            "DEPTHSCOPE_API_TOKEN": "api-s3cret",
            "DEPTHSCOPE_CLUSTERS__LAB__AUTH_TOKEN": "ray-s3cret",
            "RAY_USAGE_STATS_ENABLED": "0",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    worker = json.dumps(seen["worker"])
    assert seen["worker"]  # a real environment came back
    for value in ("s3cret", "api-s3cret", "ray-s3cret"):
        assert value not in worker
    assert not [k for k in seen["worker"] if k.startswith("DEPTHSCOPE_")]
    assert seen["runner"]["DEPTHSCOPE_DATABASE_URL"] == secret  # the runner keeps its own


def test_recovery_keeps_the_outcome_of_a_trial_told_before_the_runner_stopped(
    sqlite_url: str,
) -> None:
    """A runner that told a trial and died before closing its run row: the row takes the
    trial's outcome, it is not `lost` (and nothing is re-run)."""
    settings, Session = setup(sqlite_url)
    job = submit(Session, settings, TINY | {"name": "told"})
    with Session.begin() as s:
        s.get(Job, job.id).status = "running"
    study = study_of(sqlite_url, job)
    told, left = study.ask(), study.ask()
    for trial in (told, left):
        with Session.begin() as s:
            s.add(TrialRun(job_id=job.id, trial_number=trial.number, params={}))
    told.set_user_attr("outcome", "completed")
    study.tell(told, 3.5)
    assert Runner(settings).recover() == 1
    with Session() as s:
        runs = {r.trial_number: r.state for r in s.scalars(select(TrialRun))}
    assert runs == {told.number: "completed", left.number: "lost"}
    waiting = study_of(sqlite_url, job).get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs["ds_retry_of"] for t in waiting] == [left.number]


def test_an_outage_is_recognised_through_what_wraps_it(tmp_path: Path) -> None:
    """Optuna wraps the database's errors (StorageInternalError from an OperationalError):
    the runner and the API must still see an outage, not a bug (a 503, not a 500)."""
    from nas_service.runner.failures import is_database_outage

    url = f"sqlite:///{tmp_path / 'gone' / 'x.db'}"  # a folder that does not exist
    storage_error = None
    try:
        optuna_storage(url)
    except Exception as exc:  # what Optuna raises when it cannot reach the database
        storage_error = exc
    assert storage_error is not None and is_database_outage(storage_error)
    assert not is_database_outage(ValueError("a bug"))
