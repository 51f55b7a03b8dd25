"""/v1/health sees every runner of the database (its lease rows), not only the runner
processes the web process started: a runner started elsewhere is reported alive and ready
once its Ray answered, connecting before, and not alive once its lease expired or its
process died; the answer's fields are the same."""

from __future__ import annotations

import subprocess
import sys
import time

from fastapi.testclient import TestClient
from sqlalchemy import update

from nas_service.api.app import create_app
from nas_service.store import RunnerLease
from nas_service.store.lease import Lease, Life, host_name
from tests.support.jobs import setup


def test_health_reports_a_runner_it_did_not_start_from_the_lease_table(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    with TestClient(create_app(settings)) as client:  # the API alone: it starts no runner
        assert client.get("/v1/health").json() == {"status": "ok", "database": "ok"}

        lease = Lease(Session, "local", 60.0)  # a runner of another process, say
        life = Life(Session, "local", lease.holder)
        life.begin()
        assert lease.try_acquire()
        life.mark(acquired_at=time.time())
        r = client.get("/v1/health")
        assert r.status_code == 503
        assert r.json() == {
            "status": "degraded",
            "database": "ok",
            "runners": {"local": True},
            "runner_ray": {"local": "connecting"},
        }

        life.mark(ray_ready_at=time.time())
        r = client.get("/v1/health")
        assert r.status_code == 200
        assert r.json() == {
            "status": "ok",
            "database": "ok",
            "runners": {"local": True},
            "runner_ray": {"local": "ready"},
        }

        with Session.begin() as s:  # its lease expired: nobody drives the cluster
            s.execute(update(RunnerLease).values(expires_at=time.time() - 1))
        r = client.get("/v1/health")
        assert r.status_code == 503
        assert r.json()["runners"] == {"local": False}
        assert r.json()["runner_ray"] == {"local": "stopped"}

        lease.try_acquire()  # renewed; then it stops gracefully and gives the lease back
        life.end("stopped")
        assert client.get("/v1/health").json()["runner_ray"] == {"local": "stopped"}
        lease.release()
        assert client.get("/v1/health").json() == {"status": "ok", "database": "ok"}


def test_health_reports_a_dead_holder_of_an_unexpired_lease_as_not_alive(
    sqlite_url: str,
) -> None:
    """A runner SIGKILLed on this host leaves its lease row until it expires: its process is
    gone, so health says so at once."""
    settings, Session = setup(sqlite_url)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    assert dead.wait() == 0  # its pid names no process now
    with Session.begin() as s:
        now = time.time()
        s.add(
            RunnerLease(
                cluster="local",
                holder=f"{host_name()[:80]}:{dead.pid}:deadbeef",
                acquired_at=now,
                expires_at=now + 600,
            )
        )
    with TestClient(create_app(settings)) as client:
        r = client.get("/v1/health")
    assert r.status_code == 503
    assert r.json() == {
        "status": "degraded",
        "database": "ok",
        "runners": {"local": False},
        "runner_ray": {"local": "stopped"},
    }
