"""One runner per cluster: a lease row in the database (holder, expiry) that a runner must
hold to drive the cluster's jobs.

A runner takes the lease when nobody holds it or the holder let it expire, renews it while
it works, and gives it back when it stops. Taking and renewing are single conditional
statements (`UPDATE … WHERE holder = me OR expires_at < now`, or an `INSERT` that the
primary key makes unique), so two runners can never both hold it. A runner that cannot renew
its lease (another took it after it expired) stops at once without telling anything more.
Expiry is wall-clock time: runners on different machines need clocks synchronised to well
within the lease (NTP does this). A holder that is dead on this very host (its process is
gone, or the host restarted since: `holder_dead`) does not make the next runner wait for the
expiry: its lease is taken at once, by the same conditional statement naming that holder.

Each runner process also records its *life* (`ds_runner_lives`, `Life`): its host, boot id,
process and the service that started it, when it took the lease, when its Ray was ready,
and how it ended: a graceful stop (SIGTERM, its work done, its lease lost) writes
"stopped"; an exception out of its loop writes "crashed"; a SIGKILL (or a dead host) writes
nothing. Recovery reads it (`ended_how`) to tell a runner-only death, which a candidate may
have caused, from a graceful stop or the death of the whole service or host, which no
candidate caused; health reads it to say whether a runner's Ray is ready.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from nas_service.store import RunnerLease, RunnerLife


class LeaseLost(RuntimeError):
    """Another runner holds this cluster's lease now."""


def holder_name() -> str:
    """Who a runner is, readably: host, process id and a random suffix (a restarted process
    may reuse a process id)."""
    return f"{host_name()[:80]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def host_name() -> str:
    return socket.gethostname()[:255]


def boot_id() -> str | None:
    """This host's boot id (Linux): it changes when the host restarts."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()[:64] or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux; None if there is no
    such process or no /proc): with the pid and the boot id it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after the command name, which may hold ")"
    try:
        return int(fields[19])  # field 22 of stat; the 20th after the name
    except (IndexError, ValueError):
        return None


def alive_here(pid: int, start: int | None) -> bool:
    """Whether process `pid` (started at `start`, when known) still runs on this host."""
    if start is not None:
        return process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: How a runner's life ended (`ended_how`). Only the first three could a candidate have
#: caused: the runner itself crashed or died while its service (or the host) lived, or it
#: ran on another host, where nothing tells (counted as before).
CRASHED, RUNNER_DIED, ELSEWHERE = "crashed", "runner died", "on another host"
STOPPED, SERVICE_DIED, HOST_RESTARTED, ALIVE = "stopped", "service died", "host restarted", "alive"
CANDIDATE_MAY_HAVE_CAUSED = frozenset({CRASHED, RUNNER_DIED, ELSEWHERE})


def ended_how(life: RunnerLife) -> str:
    """How `life` ended, as far as this host can tell: what it wrote itself ("stopped",
    "crashed"); else, on this host, whether the host restarted since, whether the runner
    still runs, and whether the service that started it (if any) still runs: a runner that
    died while its service lived died alone (a candidate may have caused it), one whose
    service died too died with it; elsewhere nothing tells."""
    if life.end == STOPPED:
        return STOPPED
    if life.end is not None:
        return CRASHED
    if life.host != host_name():
        return ELSEWHERE
    here = boot_id()
    if life.boot_id is not None and here is not None and life.boot_id != here:
        return HOST_RESTARTED
    if alive_here(life.pid, life.pid_start):
        return ALIVE
    if life.service_pid is None:  # a runner started on its own: its death was its own
        return RUNNER_DIED
    if alive_here(life.service_pid, life.service_start):
        return RUNNER_DIED
    return SERVICE_DIED


def holder_dead(sessions: sessionmaker[Session], holder: str) -> bool:
    """Whether the lease holder `holder` is certainly dead: it ran on this host and its
    process is gone (or the host restarted since). Read from its life, or, for a holder that
    recorded none, from its name (host:pid:suffix, the pid checked without its start time)."""
    with sessions() as s:
        life = s.scalars(
            select(RunnerLife).where(RunnerLife.holder == holder).order_by(RunnerLife.id.desc())
        ).first()
    if life is not None:
        if life.end is not None:
            return True  # it said it ended (its release failed, or a crash in between)
        return ended_how(life) in (RUNNER_DIED, SERVICE_DIED, HOST_RESTARTED)
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != host_name()[:80] or not pid.isdigit():
        return False
    return not alive_here(int(pid), None)


#: How many of a cluster's runner lives are kept (a runner deletes older ones as it starts).
KEPT_LIVES = 100


@dataclass
class Life:
    """This runner's row in `ds_runner_lives` (see the module's docstring)."""

    sessions: sessionmaker[Session]
    cluster: str
    holder: str
    service_pid: int | None = None  # the service that started it (`--watch-parent`)
    id: int | None = None

    def begin(self) -> None:
        pid = os.getpid()
        service = self.service_pid
        with self.sessions.begin() as s:
            self.id = s.scalar(
                insert(RunnerLife)
                .values(
                    cluster=self.cluster,
                    holder=self.holder,
                    host=host_name(),
                    boot_id=boot_id(),
                    pid=pid,
                    pid_start=process_start(pid),
                    service_pid=service,
                    service_start=process_start(service) if service is not None else None,
                    started_at=time.time(),
                )
                .returning(RunnerLife.id)
            )
            oldest_kept = s.scalar(  # the lives recovery may still need; older ones go
                select(RunnerLife.id)
                .where(RunnerLife.cluster == self.cluster)
                .order_by(RunnerLife.id.desc())
                .offset(KEPT_LIVES)
                .limit(1)
            )
            if oldest_kept is not None:
                s.execute(
                    delete(RunnerLife).where(
                        RunnerLife.cluster == self.cluster, RunnerLife.id <= oldest_kept
                    )
                )

    def mark(self, **values: Any) -> None:
        """Record a step of its life (`acquired_at`, `ray_ready_at`, …)."""
        if self.id is None:
            return
        with self.sessions.begin() as s:
            s.execute(update(RunnerLife).where(RunnerLife.id == self.id).values(**values))

    def end(self, how: str, reason: str | None = None) -> None:
        self.mark(ended_at=time.time(), end=how, reason=reason)


@dataclass
class Lease:
    sessions: sessionmaker[Session]
    cluster: str
    duration_s: float
    holder: str = field(default_factory=holder_name)
    renewed_at: float = 0.0  # monotonic time of the last renewal (0: not held)

    @property
    def held(self) -> bool:
        return self.renewed_at > 0.0

    def try_acquire(self) -> bool:
        """Take the lease if it is free or expired (or already ours). True when held."""
        now = time.time()
        with self.sessions.begin() as s:
            taken = cast(  # an UPDATE's result is a cursor's (the session types it as Result)
                "CursorResult[Any]",
                s.execute(
                    update(RunnerLease)
                    .where(
                        RunnerLease.cluster == self.cluster,
                        or_(RunnerLease.holder == self.holder, RunnerLease.expires_at < now),
                    )
                    .values(holder=self.holder, acquired_at=now, expires_at=now + self.duration_s)
                ),
            ).rowcount
        if not taken:
            taken = self._take_from_the_dead(now)
        if not taken:
            try:
                with self.sessions.begin() as s:
                    s.add(
                        RunnerLease(
                            cluster=self.cluster,
                            holder=self.holder,
                            acquired_at=now,
                            expires_at=now + self.duration_s,
                        )
                    )
                taken = 1
            except IntegrityError:  # somebody holds it (or took it just now)
                taken = 0
        if taken:
            self.renewed_at = time.monotonic()
        return bool(taken)

    def _take_from_the_dead(self, now: float) -> int:
        """Take the lease from a holder that is dead on this host (`holder_dead`), at once:
        the same conditional UPDATE, naming that holder (1 when taken)."""
        holder = self.current_holder()
        if holder is None or holder == self.holder or not holder_dead(self.sessions, holder):
            return 0
        with self.sessions.begin() as s:
            taken = cast(
                "CursorResult[Any]",
                s.execute(
                    update(RunnerLease)
                    .where(RunnerLease.cluster == self.cluster, RunnerLease.holder == holder)
                    .values(holder=self.holder, acquired_at=now, expires_at=now + self.duration_s)
                ),
            ).rowcount
        return int(bool(taken))

    def current_holder(self) -> str | None:
        with self.sessions() as s:
            row = s.get(RunnerLease, self.cluster)
            return None if row is None else row.holder

    def renew(self) -> None:
        """Extend the lease; `LeaseLost` when another runner holds it now."""
        now = time.time()
        with self.sessions.begin() as s:
            kept = cast(
                "CursorResult[Any]",
                s.execute(
                    update(RunnerLease)
                    .where(RunnerLease.cluster == self.cluster, RunnerLease.holder == self.holder)
                    .values(expires_at=now + self.duration_s)
                ),
            ).rowcount
        if not kept:
            self.renewed_at = 0.0
            raise LeaseLost(f"cluster {self.cluster}: the lease is held by another runner")
        self.renewed_at = time.monotonic()

    def renew_due(self) -> bool:
        return time.monotonic() - self.renewed_at >= self.duration_s / 3

    def expired_locally(self) -> bool:
        """Whether our own last renewal is older than the lease: another runner may have
        taken it, so nothing may be told until a renewal succeeds."""
        return time.monotonic() - self.renewed_at >= self.duration_s

    def release(self) -> None:
        if not self.held:
            return
        with self.sessions.begin() as s:
            s.execute(
                delete(RunnerLease).where(
                    RunnerLease.cluster == self.cluster, RunnerLease.holder == self.holder
                )
            )
        self.renewed_at = 0.0


def lease_holders(sessions: sessionmaker[Session]) -> dict[str, tuple[bool, str]]:
    """Every cluster with a lease row, whichever process started its runner: whether a runner
    drives it now (its lease unexpired and its holder not dead on this host, `holder_dead`)
    and where that runner stands (`ready`: its Ray answered; `connecting`; `stopped`; or
    `unknown` for a holder that recorded no life)."""
    now = time.time()
    with sessions() as s:
        leases = list(s.scalars(select(RunnerLease).order_by(RunnerLease.cluster)))
        lives = {
            life.holder: life
            for life in s.scalars(
                select(RunnerLife)
                .where(RunnerLife.holder.in_([lease.holder for lease in leases]))
                .order_by(RunnerLife.id)
            )
        }
    out: dict[str, tuple[bool, str]] = {}
    for lease in leases:
        life = lives.get(lease.holder)
        alive = lease.expires_at >= now and not holder_dead(sessions, lease.holder)
        if not alive or (life is not None and life.ended_at is not None):
            out[lease.cluster] = (False, "stopped")
        elif life is None:
            out[lease.cluster] = (True, "unknown")
        else:
            out[lease.cluster] = (True, "ready" if life.ray_ready_at is not None else "connecting")
    return out
