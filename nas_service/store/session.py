"""The transaction boundary. Service functions take a `Session` and never commit; whoever
opened the session commits once, when the work succeeded (`unit_of_work`: a request's
dependency, a command, a test), or rolls back.

Work outside the database that belongs to the transaction (an Optuna study created for a
job row) registers its undoing with `on_rollback`: it runs when the transaction is rolled
back or its commit fails, so a refused or failed unit of work leaves nothing behind."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

log = logging.getLogger(__name__)

_UNDO = "ds_on_rollback"
_WROTE = "ds_wrote"


def track_writes(sessions: sessionmaker[Session]) -> None:
    """Mark a session of `sessions` that flushed or executed DML (`wrote`): a transaction
    that only read need not be committed (its close rolls it back, one round trip less)."""

    @event.listens_for(sessions, "after_flush")
    def _flushed(session: Session, _context: Any) -> None:
        session.info[_WROTE] = True

    @event.listens_for(sessions, "do_orm_execute")
    def _executed(state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            state.session.info[_WROTE] = True


def wrote(session: Session) -> bool:
    """Whether the session's transaction wrote anything (see `track_writes`)."""
    return bool(session.info.get(_WROTE))


def on_rollback(session: Session, undo: Callable[[], None]) -> None:
    """Run `undo` if this session's transaction does not commit (see `unit_of_work`)."""
    session.info.setdefault(_UNDO, []).append(undo)


def _undo(session: Session) -> None:
    for undo in reversed(session.info.pop(_UNDO, [])):
        try:
            undo()
        except Exception:  # the unit of work's own error is the one raised
            log.exception("could not undo part of a rolled-back transaction")


def roll_back(session: Session) -> None:
    """Roll the transaction back, then run its `on_rollback` undos."""
    try:
        session.rollback()
    except Exception:  # the database gone: the transaction ends with the connection
        log.warning("rollback failed", exc_info=True)
    session.info.pop(_WROTE, None)
    _undo(session)


def commit(session: Session) -> None:
    """Commit the transaction; when the commit fails, `roll_back` and raise its error."""
    try:
        session.commit()
    except BaseException:
        roll_back(session)
        raise
    session.info.pop(_UNDO, None)
    session.info.pop(_WROTE, None)


@contextmanager
def unit_of_work(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction commits when the block ends without an exception, and
    rolls back (running its `on_rollback` undos) otherwise, or when the commit fails."""
    with sessions() as session:
        try:
            yield session
        except BaseException:
            roll_back(session)
            raise
        commit(session)
