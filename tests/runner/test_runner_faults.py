"""Faults that are nobody's candidate's: an artifact store that stops taking writes, a runner
stopped by a deploy or killed with its whole service, a Ray that never answers the runner.
None of them may fail (or count) a healthy candidate. Real Ray, real runner and service
processes, real folders; only processes these tests started are signalled (`procs`)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from optuna.trial import TrialState
from sqlalchemy import select, text

from nas_service.jobs import submit
from nas_service.runner.loop import Runner
from nas_service.store import Job, RunnerLease
from tests.runner.test_faults import (
    JOB,
    ROOT,
    TRAINING,
    Service,
    StudyView,
    check_final,
    service_factory,
)
from tests.support import procs
from tests.support.jobs import TINY, counted, setup, study_of

__all__ = ["service_factory"]  # the fixture, shared with the other fault tests

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

#: A multi-fidelity job: every rung below the last writes each run's checkpoint to the
#: operator's artifact store.
FIDELITY: dict[str, Any] = TINY | {
    "name": "store",
    "budget": {"tokens": 4 * 32 * 27},
    "n_trials": 6,
    "fidelity": {"rungs": [1 / 9, 1 / 3, 1], "reduction": 3},
    "training": TINY["training"] | {"schedule": "wsd", "n_evals": 3},
}


def _drive(runner: Runner, between: Any = lambda: None, limit: float = 300) -> None:
    """The runner's loop (lease, connect, recover, schedule and poll) until its jobs are done."""
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
        else:
            time.sleep(0.2)
        between()
    raise TimeoutError("the job did not finish")


def _break(store: Path) -> None:
    """The store's folder replaced by a regular file: every write under it fails, for root
    too (a path under a file is no directory, whatever the permissions)."""
    shutil.rmtree(store)
    store.write_bytes(b"not a folder")


def _store_events(Session: Any, job_id: str) -> list[str]:
    with Session() as s:  # raw: the event kinds of a broken build may not know it
        rows = s.execute(
            text("SELECT message FROM ds_job_events WHERE job_id = :j ORDER BY id"), {"j": job_id}
        ).all()
    return [m for (m,) in rows if "artifact store" in m]


@pytest.mark.usefixtures("ray_local")
def test_a_broken_artifact_store_fails_the_job_not_the_candidates(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    job = submit(Session, settings, FIDELITY)  # the store passes the submission check
    _break(store)
    started = time.monotonic()
    _drive(Runner(settings))
    took = time.monotonic() - started
    with Session() as s:
        row = s.get(Job, job.id)
        assert row is not None
        status, error = row.status, row.error or ""
    assert status == "failed", (status, error)
    assert "artifact store" in error and str(store) not in error and "tmp" not in error, error
    study = study_of(sqlite_url, job)
    assert counted(study) == [], [(t.number, t.user_attrs.get("reason")) for t in study.trials]
    assert study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING)) == []
    paused = _store_events(Session, job.id)
    assert len(paused) >= settings.store_retries - 1, paused  # paused, retried with back-off
    assert all(str(store) not in m for m in paused), paused
    assert took < 120, took  # bounded: it does not wait forever


@pytest.mark.usefixtures("ray_local")
def test_a_store_that_comes_back_loses_nothing(sqlite_url: str, tmp_path: Path) -> None:
    store = tmp_path / "artifacts"
    settings, Session = setup(sqlite_url, artifact_store=str(store))
    job = submit(Session, settings, FIDELITY)
    _break(store)
    study = study_of(sqlite_url, job)

    def repair() -> None:
        """Once the runner has met the fault (paused, or, broken, a trial failed), the
        operator puts the folder back."""
        if store.is_file() and (
            _store_events(Session, job.id) or study.get_trials(states=(TrialState.FAIL,))
        ):
            store.unlink()
            store.mkdir()

    _drive(Runner(settings), repair)
    with Session() as s:
        assert s.scalar(select(Job.status).where(Job.id == job.id)) == "completed"
    trials = counted(study)
    assert len(trials) == FIDELITY["n_trials"]
    assert not [t.number for t in trials if t.state == TrialState.FAIL]
    assert _store_events(Session, job.id)


# -- stops no candidate caused: a deploy, the whole service killed -------------------------------

#: One candidate at a time, training for a while: each stop finds one trial training alone
#: and nothing finished since it started (the case recovery counted against it).
ALONE: dict[str, Any] = JOB | {
    "name": "alone",
    "n_trials": 2,
    "max_concurrent": 1,
    "budget": {"tokens": 4 * 32 * 400},
}


def _wait_training(svc: Service, view: StudyView, n: int, timeout: float = 150) -> None:
    """Until `n` trials are RUNNING and as many Ray workers of the service train."""
    deadline = time.monotonic() + timeout
    while True:
        assert svc.proc is not None
        if len(view.running()) == n and len(procs.find_in_tree(svc.proc.pid, TRAINING)) >= n:
            time.sleep(1.0)  # let it train a little
            return
        if time.monotonic() > deadline:
            pytest.fail(f"no {n} trials training after {timeout}s:\n{svc.tail()}")
        if not svc.alive():
            pytest.fail(f"the service died:\n{svc.tail()}")
        time.sleep(0.25)


def _poisoned(view: StudyView) -> list[int]:
    return [t.number for t in view.trials() if "poisoned" in str(t.user_attrs.get("reason"))]


def test_deploys_and_service_deaths_never_fail_a_healthy_candidate(
    db_url: str, service_factory: Any
) -> None:
    """Three stops while one candidate trains alone, none of them its doing: a graceful
    SIGTERM of the service (a deploy), a SIGKILL of its whole session, a deploy again. The
    candidate is re-run each time and never failed as poisoned; the job completes."""
    svc: Service = service_factory(db_url)
    svc.start()
    job_id = svc.submit(ALONE)
    view = StudyView(db_url, job_id)
    for stop in ("deploy", "kill", "deploy"):
        _wait_training(svc, view, 1)
        if stop == "deploy":
            svc.stop()  # SIGTERM: the service stops its runner, which stops its Ray
        else:
            svc.kill()
        assert not _poisoned(view), stop
        svc.start()
    job = svc.wait_finished(job_id, timeout=300)
    assert not _poisoned(view), [(t.number, t.user_attrs.get("reason")) for t in view.trials()]
    result = check_final(view, job, ALONE["n_trials"], {})
    assert len(result["lost"]) == 3  # the same candidate each time, re-run with its parameters


def test_a_runner_crash_is_blamed_only_on_a_candidate_that_trained_alone(
    sqlite_url: str, service_factory: Any
) -> None:
    """The runner alone SIGKILLed (with its Ray) three times while its service lives, each
    time with two trials training: a runner-only death a candidate could cause, but neither
    trained alone, so neither is blamed; the supervisor restarts the runner each time."""
    svc: Service = service_factory(sqlite_url)
    svc.start()
    spec = ALONE | {"name": "together", "n_trials": 4, "max_concurrent": 2}
    job_id = svc.submit(spec)
    view = StudyView(sqlite_url, job_id)
    for _ in range(3):
        _wait_training(svc, view, 2)
        (runner,) = svc.runner_pids()
        procs.kill_tree(runner)  # the runner and the Ray it started; the service lives
        deadline = time.monotonic() + 60
        while not svc.runner_pids() or svc.runner_pids() == {runner}:
            assert time.monotonic() < deadline, f"no runner restarted:\n{svc.tail()}"
            time.sleep(0.3)
    job = svc.wait_finished(job_id, timeout=300)
    assert not _poisoned(view), [(t.number, t.user_attrs.get("reason")) for t in view.trials()]
    check_final(view, job, spec["n_trials"], {})


def test_a_runner_crash_while_one_candidate_trains_alone_still_counts(
    sqlite_url: str, service_factory: Any
) -> None:
    """The other side: the runner alone killed three times while its service lives and one
    candidate trains alone is what a poisoned candidate does: it is failed as poisoned (and
    counted), the job completes."""
    svc: Service = service_factory(sqlite_url)
    svc.start()
    job_id = svc.submit(ALONE | {"name": "crashy", "n_trials": 1})
    view = StudyView(sqlite_url, job_id)
    for _ in range(3):
        _wait_training(svc, view, 1)
        (runner,) = svc.runner_pids()
        procs.kill_tree(runner)
        deadline = time.monotonic() + 60
        while not svc.runner_pids() or svc.runner_pids() == {runner}:
            assert time.monotonic() < deadline, f"no runner restarted:\n{svc.tail()}"
            time.sleep(0.3)
    job = svc.wait_finished(job_id, timeout=300)
    assert job["status"] == "completed"
    assert len(_poisoned(view)) == 1 and len(view.counted()) == 1


# -- a Ray that never answers; a dead holder's lease -------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port held by a process that accepts connections and never answers (as a hung Ray
    head, or another program on its port, does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


def _start_waiting(svc: Service, timeout: float = 120) -> None:
    """Start the service and wait until its API answers health at all (200 or 503)."""
    log_path = svc.logdir / f"service{len(svc.logs)}.log"
    svc.logs.append(log_path)
    with log_path.open("wb") as log:
        svc.proc = subprocess.Popen(
            [sys.executable, "-m", "nas_service.cli", "serve", "--port", str(svc.port)],
            cwd=ROOT,
            env=svc.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            svc.http.get("/v1/health", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    pytest.fail(f"the service did not answer:\n{svc.tail()}")


def test_a_ray_that_never_answers_is_given_up_and_health_says_so(
    sqlite_url: str, service_factory: Any, silent_port: int
) -> None:
    svc: Service = service_factory(
        sqlite_url,
        DEPTHSCOPE_CLUSTERS__LOCAL__ADDRESS=f"127.0.0.1:{silent_port}",
        DEPTHSCOPE_RAY_CONNECT_TIMEOUT_S="3",
    )
    _start_waiting(svc)
    first: set[int] = set()
    deadline = time.monotonic() + 30
    while not first:
        first = svc.runner_pids()
        assert time.monotonic() < deadline, svc.tail()
        time.sleep(0.2)
    r = svc.http.get("/v1/health")
    body = r.json()
    assert r.status_code == 503 and body["status"] == "degraded", body
    assert body["runners"] == {"local": True}, body
    assert body["runner_ray"]["local"] != "ready", body
    # the runner gives up within its deadline, says why, and the service starts it again
    deadline = time.monotonic() + 3 + 5 + 20
    while svc.runner_pids() in (first, set()):
        assert time.monotonic() < deadline, f"the runner is still stuck:\n{svc.tail()}"
        time.sleep(0.2)
    assert "did not answer within 3 s" in svc.tail(20000)
    body = svc.http.get("/v1/health").json()
    assert body["runner_ray"]["local"] != "ready", body


def _runner(url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    out = log.open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "nas_service.runner", "--cluster", "local", "--forever"],
        env=os.environ
        | {
            "DEPTHSCOPE_DATABASE_URL": url,
            "DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS": "2",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        | env,
        cwd=ROOT,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )


def _holder(Session: Any) -> str | None:
    with Session() as s:
        lease = s.get(RunnerLease, "local")
        return None if lease is None else lease.holder


def test_a_sigterm_while_ray_does_not_answer_stops_the_runner_at_once(
    sqlite_url: str, tmp_path: Path, silent_port: int
) -> None:
    _, Session = setup(sqlite_url)
    proc = _runner(
        sqlite_url,
        tmp_path / "runner.log",
        DEPTHSCOPE_CLUSTERS__LOCAL__ADDRESS=f"127.0.0.1:{silent_port}",
        DEPTHSCOPE_RAY_CONNECT_TIMEOUT_S="120",
    )
    try:
        deadline = time.monotonic() + 60
        while f":{proc.pid}:" not in (_holder(Session) or ""):
            assert time.monotonic() < deadline, (tmp_path / "runner.log").read_text()
            time.sleep(0.2)
        time.sleep(2.0)  # inside ray.init by now
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - stopped
    finally:
        procs.kill_session(proc)
    assert took < 10, (took, (tmp_path / "runner.log").read_text()[-3000:])
    assert _holder(Session) is None  # the lease given back on the way out


def test_a_lease_whose_holder_died_on_this_host_is_taken_at_once(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings, Session = setup(sqlite_url)
    submit(Session, settings, TINY | {"name": "lease", "budget": {"tokens": 4 * 32 * 100_000}})
    first = _runner(sqlite_url, tmp_path / "first.log", DEPTHSCOPE_RUNNER_LEASE_S="120")
    second = None
    try:
        deadline = time.monotonic() + 120
        while f":{first.pid}:" not in (_holder(Session) or ""):
            assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.2)
        procs.kill_session(first)  # crashed: its lease is held for 120 s more
        second = _runner(sqlite_url, tmp_path / "second.log", DEPTHSCOPE_RUNNER_LEASE_S="120")
        started = time.monotonic()
        while f":{second.pid}:" not in (_holder(Session) or ""):
            assert time.monotonic() - started < 30, (tmp_path / "second.log").read_text()
            time.sleep(0.2)
    finally:
        procs.kill_session(first)
        if second is not None:
            procs.kill_session(second)


def test_how_a_runner_life_ended_is_told_from_its_processes(sqlite_url: str) -> None:
    """`ended_how` on real processes of this host: a runner dead while its service lives
    died alone; one whose service died too died with it; one on a host since restarted (a
    boot id of another boot); one that said it stopped; one still alive."""
    from nas_service.store import RunnerLife
    from nas_service.store.lease import Life, boot_id, ended_how, holder_dead, process_start

    _, Session = setup(sqlite_url)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    service, runner = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    try:
        life = Life(Session, "local", f"h:{runner.pid}:x", service_pid=service.pid)
        life.begin()
        with Session.begin() as s:  # as the runner would have written it itself
            row = s.get(RunnerLife, life.id)
            assert row is not None
            row.pid = runner.pid
            row.pid_start = process_start(runner.pid)

        def how() -> str:
            with Session() as s:
                row = s.get(RunnerLife, life.id)
                assert row is not None
                return ended_how(row)

        assert how() == "alive"
        assert not holder_dead(Session, life.holder)
        runner.kill()
        runner.wait()
        assert how() == "runner died"
        assert holder_dead(Session, life.holder)
        service.kill()
        service.wait()
        assert how() == "service died"
        with Session.begin() as s:
            row = s.get(RunnerLife, life.id)
            assert row is not None and row.boot_id == boot_id()
            row.boot_id = "another-boot"
        assert how() == "host restarted"
        life.end("stopped")
        assert how() == "stopped"
    finally:
        for p in (service, runner):
            p.kill()
            p.wait()


def test_a_client_waiting_on_a_job_rides_out_a_runner_restart(
    sqlite_url: str, service_factory: Any
) -> None:
    """`Job.wait` (and so `depthscope submit --wait`) reads the service's health at each
    poll. The runner killed while the service lives: health is degraded (503) until the
    supervisor's new runner has its Ray, a few seconds; the wait rides it out and returns the
    completed job instead of raising on the first degraded answer."""
    import threading

    from nas_service.client import Client, ClientError

    svc: Service = service_factory(sqlite_url)
    svc.start()
    job_id = svc.submit(ALONE | {"name": "waited", "n_trials": 1})
    outcome: dict[str, Any] = {}

    def follow() -> None:
        try:
            with Client(svc.base) as client:
                outcome["job"] = client.job(job_id).wait(progress=False, poll_s=0.2)
        except Exception as exc:  # what the waiting user would see
            outcome["error"] = exc

    waiter = threading.Thread(target=follow, daemon=True)
    waiter.start()
    view = StudyView(sqlite_url, job_id)
    _wait_training(svc, view, 1)
    (runner,) = svc.runner_pids()
    procs.kill_tree(runner)  # the runner and its Ray; the service lives and restarts it
    with Client(svc.base) as client, pytest.raises(ClientError) as refused:
        client.job(job_id).wait(progress=False, poll_s=0.2, unhealthy_s=0)  # no patience
    assert refused.value.status == 503
    waiter.join(timeout=300)
    assert not waiter.is_alive(), f"the wait never returned:\n{svc.tail()}"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["job"].status.value == "completed"
