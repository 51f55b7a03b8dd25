"""The service's database: its own tables (jobs, job events, trial runs) under Alembic
migrations, beside Optuna's studies in the same database."""

from nas_service.db.engine import make_engine, make_sessionmaker, normalise_url
from nas_service.db.migrate import VERSION_TABLE, current, downgrade, head, upgrade
from nas_service.db.models import JOB_STATES, RUN_STATES, Base, Job, JobEvent, RunnerLease, TrialRun

__all__ = [
    "JOB_STATES",
    "RUN_STATES",
    "VERSION_TABLE",
    "Base",
    "Job",
    "JobEvent",
    "RunnerLease",
    "TrialRun",
    "current",
    "downgrade",
    "head",
    "make_engine",
    "make_sessionmaker",
    "normalise_url",
    "upgrade",
]
