"""A private PostgreSQL server for the fault tests: its own data folder, its own port on
127.0.0.1, trust authentication, stopped and restarted at will (the shared server on 5432 is
never touched).

initdb and postgres refuse to run as root: when the tests run as root, both run as the
`postgres` user (`subprocess.Popen(user=...)`, which execs directly, so the pid we hold is the
postmaster's). The data folder is a fresh folder under /tmp owned by that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support import procs

PG_BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14, 13)]


class PostgresUnavailable(RuntimeError):
    pass


def _bin_dir() -> Path:
    override = os.environ.get("DEPTHSCOPE_TEST_PG_BIN")
    candidates = [Path(override)] if override else []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    candidates += PG_BIN_DIRS
    for d in candidates:
        if all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in "
        f"{[str(c) for c in candidates]}; install postgresql or set DEPTHSCOPE_TEST_PG_BIN"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """`initdb` into a fresh folder, then `start()`; `url` names a fresh database on it."""

    def __init__(self, startup_timeout: float = 60.0) -> None:
        self.bin = _bin_dir()
        self.startup_timeout = startup_timeout
        self.as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root, and there is no `postgres` user to run initdb and the "
                    "server as (initdb refuses root)"
                ) from None
            self.as_user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="ds-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "server.log"
        self.socket_dir.mkdir()
        if self.as_user is not None:
            entry = pwd.getpwnam(self.as_user)
            for p in (self.root, self.socket_dir):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.database = f"ds_fault_{uuid.uuid4().hex[:8]}"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"
        self._initdb()

    # -- running the binaries as the postgres user ---------------------------------------
    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"cwd": self.root, "start_new_session": True}
        if self.as_user is not None:
            entry = pwd.getpwnam(self.as_user)
            kwargs |= {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            kwargs["env"] = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self.root),
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
            }
        return kwargs

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, **self._popen_kwargs()
        )
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out

    def _initdb(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            timeout=120,
        )

    # -- the server ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the server on the same data folder and port; return once it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.socket_dir}",
                "-c",
                "fsync=off",  # a crash of the server process keeps the OS's page cache
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=32MB",
            ],
            stdout=log,
            stderr=log,
            **self._popen_kwargs(),
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: {self.tail()}")
            if self._accepts():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not accept connections: {self.tail()}")
            time.sleep(0.2)

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
            ):
                return True
        except psycopg.OperationalError:
            return False

    def create_database(self, name: str | None = None) -> str:
        """A fresh database on this server; its SQLAlchemy URL."""
        import psycopg

        name = name or f"ds_fault_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`pg_ctl stop -m immediate` by default: no checkpoint, the
        backends quit at once, as after a crash); fall back to SIGKILL of its tree."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w")
            self.proc.wait(timeout=30)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (its descendants: each in its own session)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        procs.kill_tree(self.proc.pid)
        self.proc.wait(timeout=30)

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the server and remove its folder."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.stop("fast")
        finally:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.proc.send_signal(signal.SIGKILL)
                    self.proc.wait(timeout=10)
            shutil.rmtree(self.root, ignore_errors=True)


def private_postgres(startup_timeout: float = 60.0) -> PrivatePostgres:
    """A started private server with a fresh database at `.url`."""
    pg = PrivatePostgres(startup_timeout)
    try:
        pg.start()
        pg.create_database(pg.database)
    except BaseException:
        pg.close()
        raise
    return pg
