"""job cluster: each job's cluster as a column, backfilled from its stored spec

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: The local cluster's name (`settings.LOCAL_CLUSTER` at this revision): a row whose spec
#: names no cluster is the local cluster's, as a spec without one is.
LOCAL = "local"
#: The longest cluster name (`settings.MAX_CLUSTER_NAME` at this revision).
MAX_NAME = 100

_jobs = sa.table("ds_jobs", sa.column("id", sa.String), sa.column("spec", sa.JSON))
_cluster = sa.table("ds_jobs", sa.column("id", sa.String), sa.column("cluster", sa.String))


def cluster_of(spec: Any) -> str:
    """The cluster a stored spec names: its `cluster` where that is a name (text, not empty,
    cut to `MAX_NAME`), else the local cluster."""
    name = spec.get("cluster") if isinstance(spec, dict) else None
    return name[:MAX_NAME] if isinstance(name, str) and name else LOCAL


def upgrade() -> None:
    # NOT NULL with the local cluster as the default: every existing row takes it at once, on
    # SQLite too (which cannot add a NOT NULL column without one, nor drop a default without
    # rebuilding the table); the rows whose spec names another cluster are then rewritten.
    op.add_column(
        "ds_jobs",
        sa.Column("cluster", sa.String(MAX_NAME), nullable=False, server_default=LOCAL),
    )
    conn = op.get_bind()
    named = [
        {"job_id": row.id, "name": name}
        for row in conn.execute(sa.select(_jobs.c.id, _jobs.c.spec))
        if (name := cluster_of(row.spec)) != LOCAL
    ]
    if named:
        conn.execute(
            _cluster.update()
            .where(_cluster.c.id == sa.bindparam("job_id"))
            .values(cluster=sa.bindparam("name")),
            named,
        )
    op.create_index("ix_ds_jobs_cluster", "ds_jobs", ["cluster"])


def downgrade() -> None:
    op.drop_index("ix_ds_jobs_cluster", "ds_jobs")
    op.drop_column("ds_jobs", "cluster")
