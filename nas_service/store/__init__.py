"""The service's database: its own tables (jobs, job events, trial runs) under Alembic
migrations, beside Optuna's studies in the same database."""

from nas_service.store.engine import make_engine, make_sessionmaker, normalise_url
from nas_service.store.migrate import VERSION_TABLE, current, downgrade, head, upgrade
from nas_service.store.session import (
    commit,
    on_rollback,
    roll_back,
    track_writes,
    unit_of_work,
    wrote,
)
from nas_service.store.tables import (
    ACTIVE_STATES,
    JOB_STATES,
    RUN_STATES,
    Base,
    EventKind,
    Job,
    JobEvent,
    JobStatus,
    RunnerLease,
    RunnerLife,
    RunState,
    TrialOutcome,
    TrialRun,
    TrialStatus,
)

__all__ = [
    "ACTIVE_STATES",
    "JOB_STATES",
    "RUN_STATES",
    "VERSION_TABLE",
    "Base",
    "EventKind",
    "Job",
    "JobEvent",
    "JobStatus",
    "RunState",
    "RunnerLease",
    "RunnerLife",
    "TrialOutcome",
    "TrialRun",
    "TrialStatus",
    "commit",
    "current",
    "downgrade",
    "head",
    "make_engine",
    "make_sessionmaker",
    "normalise_url",
    "on_rollback",
    "roll_back",
    "track_writes",
    "unit_of_work",
    "upgrade",
    "wrote",
]
