"""Faults under the real service (`depthscope serve`, its runner child process and the local
Ray the runner starts), each in its own process session, driven over HTTP:

- the whole service SIGKILLed five times mid-job and restarted (SQLite and PostgreSQL);
- one Ray training worker of the service killed mid-training;
- the service's PostgreSQL server stopped mid-job and started again.

After each, the job completes with exactly `n_trials` counted trials, no completed trial
lost or changed, and every re-run trial re-runs a lost one. Only processes these tests
started are signalled: through their process group and process tree (`procs`)."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from nas_service.store import JobEvent, RunnerLease, TrialRun, make_engine, make_sessionmaker
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrialAttr
from tests.support import procs
from tests.support.jobs import TINY
from tests.support.postgres import PrivatePostgres

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
RETRY_OF = "ds_retry_of"
LEASE_S = 3

JOB: dict[str, Any] = TINY | {
    "name": "faults",
    "budget": {"tokens": 4 * 32 * 60},  # a second or two of training per trial
    "n_trials": 10,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """`depthscope serve` on a loopback port, in a process session of its own."""

    def __init__(self, db_url: str, logdir: Path, **env: str) -> None:
        self.db_url = db_url
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logdir = logdir
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DEPTHSCOPE_", "RAY_"))
        }
        self.env |= {
            "DEPTHSCOPE_DATABASE_URL": db_url,
            "DEPTHSCOPE_RUNNER_LEASE_S": str(LEASE_S),
            "DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS": "2",
            "RAY_USAGE_STATS_ENABLED": "0",
        } | env
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def start(self, timeout: float = 120.0) -> None:
        log_path = self.logdir / f"service{len(self.logs)}.log"
        self.logs.append(log_path)
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nas_service.cli", "serve", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if procs.exited(self.proc):
                pytest.fail(f"the service exited:\n{self.tail()}")
            try:
                if self.http.get("/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the service did not become healthy:\n{self.tail()}")
            time.sleep(0.3)

    def alive(self) -> bool:
        return self.proc is not None and not procs.exited(self.proc)

    def kill(self) -> list[int]:
        """SIGKILL the service's whole session: API, runner, the runner's Ray (gcs, raylet,
        workers, each worker in a process group of its own) — and wait until all are gone."""
        assert self.proc is not None
        tree = procs.descendants(self.proc.pid)
        killed = procs.kill_session(self.proc)  # raises if any is still alive after 30 s
        assert not procs.wait_gone(tree, timeout=5), "a process of the service survived"
        return killed

    def stop(self) -> None:
        if self.proc is not None:
            procs.terminate_session(self.proc, grace=30)

    def runner_pids(self) -> set[int]:
        if not self.alive():
            return set()
        assert self.proc is not None
        return {p.pid for p in procs.find_in_tree(self.proc.pid, RUNNER)}

    def tail(self, n: int = 4000) -> str:
        text = ""
        for path in self.logs:
            try:
                text += f"--- {path.name}\n" + path.read_text(errors="replace")[-n:]
            except OSError:
                continue
        return text[-3 * n :]

    def submit(self, spec: dict[str, Any]) -> str:
        r = self.http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_finished(self, job_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] not in ("pending", "running"):
                return job
            if time.monotonic() > deadline:
                pytest.fail(f"job still {job['status']} after {timeout}s:\n{self.tail()}")
            if not self.alive():
                pytest.fail(f"the service died:\n{self.tail()}")
            time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        return bool(procs.psutil.Process(pid).status() != procs.psutil.STATUS_ZOMBIE)
    except procs.psutil.NoSuchProcess:
        return False


RUNNER = procs.cmdline_contains("nas_service.runner")
TRAINING = procs.cmdline_contains("ray::train_streaming")


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Service] = []

    def make(db_url: str, **env: str) -> Service:
        svc = Service(db_url, tmp_path, **env)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()
        svc.http.close()


class StudyView:
    """The job's Optuna study, read straight from the database."""

    def __init__(self, db_url: str, job_id: str) -> None:
        self.storage = optuna_storage(db_url)
        self.study = optuna.load_study(study_name=f"depthscope-{job_id}", storage=self.storage)

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def counted(self) -> list[optuna.trial.FrozenTrial]:
        return [
            t for t in self.trials() if t.state in COUNTED and not t.user_attrs.get(TrialAttr.LOST)
        ]

    def running(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.trials() if t.state == TrialState.RUNNING]

    def completed_values(self) -> dict[int, list[float]]:
        return {
            t.number: list(t.values)
            for t in self.trials()
            if t.state == TrialState.COMPLETE and not t.user_attrs.get(TrialAttr.LOST)
        }

    def wait(self, done_at_least: int, running_at_least: int, timeout: float, svc: Service) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done, running = len(self.counted()), len(self.running())
            if done >= done_at_least and running >= running_at_least:
                return
            if time.monotonic() > deadline:
                pytest.fail(
                    f"waited {timeout}s for {done_at_least} trials done and {running_at_least} "
                    f"running; have {done} and {running}\n{svc.tail()}"
                )
            if not svc.alive():
                pytest.fail(f"the service died:\n{svc.tail()}")
            time.sleep(0.25)


def check_final(
    view: StudyView, job: dict[str, Any], n_trials: int, completed_before: dict[int, list[float]]
) -> dict[str, Any]:
    """The job completed with exactly `n_trials` counted trials, every re-run trial re-runs
    the parameters of a lost one (each lost trial once), nothing else was added, and every
    trial completed before a fault is still completed with the same values."""
    assert job["status"] == "completed", job
    assert job["progress"]["counted"] == n_trials, job["progress"]
    trials = view.trials()
    by_number = {t.number: t for t in trials}
    counted = view.counted()
    assert len(counted) == n_trials, [
        (t.number, t.state, t.user_attrs.get(TrialAttr.LOST)) for t in trials
    ]
    left = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert not left, f"trials left running or waiting after completion: {left}"
    lost = {t.number for t in trials if t.user_attrs.get(TrialAttr.LOST)}
    assert all(by_number[n].state == TrialState.FAIL for n in lost)
    retry_of = collections.Counter(
        t.user_attrs[RETRY_OF] for t in trials if RETRY_OF in t.user_attrs
    )
    assert set(retry_of) == lost, f"re-runs of {sorted(retry_of)}, lost {sorted(lost)}"
    assert all(c == 1 for c in retry_of.values()), f"a lost trial re-run twice: {retry_of}"
    full = {frozenset(t.params) for t in counted if t.state == TrialState.COMPLETE}
    for t in trials:
        if RETRY_OF in t.user_attrs:
            # the lost trial's parameters, every one it had drawn (all of them, unless the
            # service was killed while it drew them), and the retry has drawn the rest
            lost_params = by_number[t.user_attrs[RETRY_OF]].params
            assert lost_params.items() <= t.params.items(), t.number
            assert frozenset(t.params) in full, t.number
    assert len(trials) == n_trials + len(lost), "trials beyond n_trials and the re-runs"
    now = view.completed_values()
    for number, values in completed_before.items():
        assert now.get(number) == values, (
            f"completed trial {number} changed: {values} → {now.get(number)}"
        )
    return {"lost": sorted(lost), "trials": len(trials)}


# -- the helpers themselves ---------------------------------------------------------------

TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, time; os.setpgid(0, 0); print(os.getpid(), flush=True); time.sleep(600)"],
    stdout=sys.stdout)
time.sleep(600)
"""


def test_kill_session_stops_the_whole_tree_and_nothing_else(tmp_path: Path) -> None:
    """A grandchild in a process group of its own (as Ray's workers are) dies with the
    session; a process we started apart, in its own session, is not touched."""
    out = tmp_path / "pids"
    with out.open("w") as f:
        leader = subprocess.Popen([sys.executable, "-c", TREE], stdout=f, start_new_session=True)
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not out.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = int(out.read_text().split()[0])
        assert os.getpgid(grandchild) == grandchild != leader.pid  # its own group
        tree = {p.pid for p in procs.descendants(leader.pid)}
        assert grandchild in tree
        killed = procs.kill_session(leader)
        assert {leader.pid, grandchild} <= set(killed)
        assert not _alive(grandchild) and leader.returncode is not None
        assert not procs.exited(bystander)  # untouched
    finally:
        procs.kill_session(leader)
        procs.kill_session(bystander)


# -- SIGKILL of the whole service, five times ---------------------------------------------


#: Enough trials that five kills, each after at least one more trial counted, still find
#: the job running: with 10 trials of a second or two, the last two sometimes finished
#: between two polls before the fifth kill (and the test waited for a running trial).
FIVE_KILLS: dict[str, Any] = JOB | {"name": "faults-5", "n_trials": 20}


def test_service_sigkilled_five_times_mid_job(db_url: str, service_factory: Any) -> None:
    svc: Service = service_factory(db_url)
    svc.start()
    job_id = svc.submit(FIVE_KILLS)
    view = StudyView(db_url, job_id)
    n = FIVE_KILLS["n_trials"]
    completed_before: dict[int, list[float]] = {}
    done = 0
    for kill in range(5):
        view.wait(done_at_least=done + 1, running_at_least=1, timeout=150, svc=svc)
        assert svc.proc is not None
        tree = procs.descendants(svc.proc.pid)
        assert procs.find_in_tree(svc.proc.pid, RUNNER), "no runner under the service"
        svc.kill()
        assert all(not _alive(p.pid) for p in tree)
        now = view.completed_values()
        for number, values in completed_before.items():  # nothing completed is lost or changed
            assert now.get(number) == values, (kill, number, values, now.get(number))
        completed_before = now
        counted = len(view.counted())
        assert counted >= done + 1 and counted < n, (kill, counted)
        done = counted
        svc.start()
    job = svc.wait_finished(job_id, timeout=240)
    result = check_final(view, job, n, completed_before)
    assert result["lost"], "five kills mid-trial lose (and re-run) some trials"


# -- SIGKILL of the API process alone -----------------------------------------------------


def test_the_api_alone_sigkilled(sqlite_url: str, service_factory: Any) -> None:
    """The runner notices its service is gone and stops (with its Ray), giving back its
    lease; the restarted service's runner takes over at once: never two runners, no trial
    trained twice."""
    svc: Service = service_factory(sqlite_url)
    svc.start()
    job_id = svc.submit(JOB | {"name": "api-alone", "n_trials": 6})
    view = StudyView(sqlite_url, job_id)
    view.wait(done_at_least=1, running_at_least=1, timeout=150, svc=svc)
    assert svc.proc is not None
    runners = procs.find_in_tree(svc.proc.pid, RUNNER)
    assert len(runners) == 1
    tree = procs.descendants(svc.proc.pid)
    completed_before = view.completed_values()
    os.kill(svc.proc.pid, signal.SIGKILL)  # the API process only, not its session
    svc.proc.wait(timeout=10)
    left = procs.wait_gone(tree, timeout=30)
    assert left == [], f"outlived the API: {[p.cmdline()[:3] for p in left]}"
    Session = make_sessionmaker(make_engine(sqlite_url))
    with Session() as s:
        assert s.get(RunnerLease, "local") is None  # given back on the way out
    svc.start()
    job = svc.wait_finished(job_id, timeout=240)
    check_final(view, job, 6, completed_before)
    with Session() as s:
        runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job_id)))
    spans = [(r.started_at, r.finished_at) for r in runs if r.finished_at is not None]
    for start, _ in spans:  # never more than max_concurrent training at once
        assert sum(1 for a, b in spans if a <= start < b) <= JOB["max_concurrent"]
    assert len([r for r in runs if r.state == "completed"]) == len(view.completed_values())


# -- one Ray worker killed under the service ----------------------------------------------


def test_a_killed_ray_worker_under_the_service_is_retried(
    sqlite_url: str, service_factory: Any
) -> None:
    svc: Service = service_factory(sqlite_url)
    svc.start()
    n = 4
    job_id = svc.submit(JOB | {"name": "worker", "n_trials": n, "budget": {"tokens": 4 * 32 * 200}})
    assert svc.proc is not None
    workers = procs.wait_in_tree(svc.proc.pid, TRAINING, timeout=120)
    assert workers, f"no training worker under the service:\n{svc.tail()}"
    time.sleep(1.0)  # let it train a little
    victim = workers[0]
    assert os.getsid(victim.pid) == svc.proc.pid  # in the service's session
    victim.send_signal(signal.SIGKILL)
    assert not procs.wait_gone([victim], timeout=10)
    job = svc.wait_finished(job_id, timeout=240)
    view = StudyView(sqlite_url, job_id)
    result = check_final(view, job, n, {})
    assert result["lost"] == []  # the runner lived: a retry, not a recovery
    Session = make_sessionmaker(make_engine(sqlite_url))
    with Session() as s:
        retries = list(
            s.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "trial_retry")
            )
        )
        runs = list(s.scalars(select(TrialRun).where(TrialRun.job_id == job_id)))
    assert len(retries) == 1, [e.message for e in retries]
    completed_runs = [r for r in runs if r.state == "completed"]
    assert sorted(r.trial_number for r in completed_runs) == sorted(
        t.number for t in view.counted()
    )  # every counted trial trained to completion once
    assert [r.attempt for r in completed_runs].count(2) == 1  # one of them on a second attempt
    retried = next(r.trial_number for r in completed_runs if r.attempt == 2)
    others = [(r.trial_number, r.state) for r in runs if r.state != "completed"]
    assert others in ([], [(retried, "lost")]), others  # at most the killed attempt's row
    assert job["progress"]["completed"] == n


# -- PostgreSQL stopped and started again mid-job -----------------------------------------


@pytest.mark.postgres
def test_postgres_outage_mid_job(private_pg: PrivatePostgres, service_factory: Any) -> None:
    url = private_pg.create_database()
    svc: Service = service_factory(url)
    svc.start()
    job_id = svc.submit(JOB | {"name": "outage"})
    view = StudyView(url, job_id)
    n = JOB["n_trials"]
    view.wait(done_at_least=2, running_at_least=1, timeout=150, svc=svc)
    completed_before = view.completed_values()
    runners_before = svc.runner_pids()
    assert runners_before
    view.storage.engine.dispose()

    private_pg.stop()  # immediate shutdown: backends quit, connections drop
    observed: dict[str, Any] = {"health": collections.Counter(), "job": collections.Counter()}
    runner_pids: list[set[int]] = []
    outage_end = time.monotonic() + 8
    while time.monotonic() < outage_end:
        r = svc.http.get("/v1/health", timeout=10)
        observed["health"][r.status_code] += 1
        assert r.status_code == 503, r.text
        assert r.json()["database"].startswith("unreachable"), r.text
        r = svc.http.get(f"/v1/jobs/{job_id}", timeout=10)
        observed["job"][r.status_code] += 1
        assert r.status_code >= 500, r.text  # an error, not stale success or a hang
        assert svc.alive(), f"the API process died during the outage:\n{svc.tail()}"
        runner_pids.append(svc.runner_pids())
        time.sleep(0.5)

    private_pg.start()
    back = time.monotonic()
    while True:
        try:
            if svc.http.get("/v1/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() - back < 15, f"health not 200 15s after restart:\n{svc.tail()}"
        time.sleep(0.3)
    healthy_after = time.monotonic() - back
    assert svc.alive()
    # the runner (itself or a restart by the supervisor) resumes; then it stays up
    settle = time.monotonic() + 12
    while time.monotonic() < settle and not svc.runner_pids():
        time.sleep(0.5)
    stable = svc.runner_pids()
    assert stable, f"no runner 12s after the database came back:\n{svc.tail()}"
    job = svc.wait_finished(job_id, timeout=240)
    assert svc.runner_pids() == stable, (
        f"the runner restarted after the database was back (crash loop?): {stable} → "
        f"{svc.runner_pids()}\n{svc.tail()}"
    )
    result = check_final(view, job, n, completed_before)
    print(
        f"outage: health codes {dict(observed['health'])}, job codes {dict(observed['job'])}, "
        f"runners before {runners_before}, during {runner_pids}, after {stable}, healthy "
        f"{healthy_after:.1f}s after restart, lost {result['lost']}"
    )
