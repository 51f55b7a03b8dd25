"""The Optuna this version of the project was tested against, checked at start-up.

The runner's storage (`nas_service.store.optuna_storage`) and the bulk reads and writes of Optuna's
tables (`nas_service.store.trial_tables`) reach into Optuna's private classes and its table
definitions, which Optuna may change in any minor release. So the project pins the tested
minor series (`pyproject.toml`), and the runner and the API refuse to start, with a message
saying what differs, on another Optuna version or on a database whose Optuna tables are at
another schema revision (Optuna records it in its `alembic_version` and `version_info`
tables), rather than reading or writing them wrongly. A database without Optuna's tables
yet passes: the tested Optuna creates them at its own revision.
"""

from __future__ import annotations

import optuna
from sqlalchemy import inspect, text

from nas_service.store import make_engine

#: The Optuna minor series the project was tested against (`pyproject.toml` pins it).
TESTED_OPTUNA = (5, 1)
#: The revision of Optuna's tables that series writes (its `alembic_version.version_num`)
#: and its `version_info.schema_version`.
TESTED_SCHEMA_REVISION = "v3.2.0.a"
TESTED_SCHEMA_VERSION = 12


class OptunaMismatch(RuntimeError):
    """Optuna, or the database's Optuna tables, are not what the project was tested with."""


def check_optuna(url: str, installed: str | None = None) -> None:
    """Raise `OptunaMismatch` unless the installed Optuna (`installed`: its version string,
    default the one imported) is of the tested series and the database at `url` has no
    Optuna tables or has them at the tested schema revision."""
    version = installed if installed is not None else optuna.__version__
    series = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    tested = ".".join(map(str, TESTED_OPTUNA))
    if series != TESTED_OPTUNA:
        raise OptunaMismatch(
            f"optuna {version} is installed, but this version of depthscope was tested "
            f"with optuna {tested}.x only: install optuna>={tested},<{TESTED_OPTUNA[0]}."
            f"{TESTED_OPTUNA[1] + 1}"
        )
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            revision = schema = None
            if "alembic_version" in tables:
                revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            if "version_info" in tables:
                schema = conn.execute(text("SELECT schema_version FROM version_info")).scalar()
    finally:
        engine.dispose()
    if revision is not None and revision != TESTED_SCHEMA_REVISION:
        raise OptunaMismatch(
            f"the database's Optuna tables are at schema revision {revision!r}, but this "
            f"version of depthscope was tested with revision {TESTED_SCHEMA_REVISION!r} "
            f"(optuna {tested}.x): migrate them with `optuna storage upgrade` of that "
            "Optuna, or use the depthscope release tested with theirs."
        )
    if schema is not None and schema != TESTED_SCHEMA_VERSION:
        raise OptunaMismatch(
            f"the database's Optuna tables record schema version {schema}, but this version "
            f"of depthscope was tested with schema version {TESTED_SCHEMA_VERSION} "
            f"(optuna {tested}.x)."
        )
