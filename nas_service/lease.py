"""One runner per cluster: a lease row in the database (holder, expiry) that a runner must
hold to drive the cluster's jobs.

A runner takes the lease when nobody holds it or the holder let it expire, renews it while
it works, and gives it back when it stops. Taking and renewing are single conditional
statements (`UPDATE … WHERE holder = me OR expires_at < now`, or an `INSERT` that the
primary key makes unique), so two runners can never both hold it. A runner that cannot renew
its lease (another took it after it expired) stops at once without telling anything more.
Expiry is wall-clock time: runners on different machines need clocks synchronised to well
within the lease (NTP does this).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from nas_service.db import RunnerLease


class LeaseLost(RuntimeError):
    """Another runner holds this cluster's lease now."""


def holder_name() -> str:
    """Who a runner is, readably: host, process id and a random suffix (a restarted process
    may reuse a process id)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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
