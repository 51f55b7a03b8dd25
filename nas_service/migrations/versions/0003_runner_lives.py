"""runner lives: how each runner process ended, and whether its Ray is ready

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ds_runner_lives",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pid_start", sa.Integer(), nullable=True),
        sa.Column("service_pid", sa.Integer(), nullable=True),
        sa.Column("service_start", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=True),
        sa.Column("ray_ready_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("end", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_ds_runner_lives_cluster", "ds_runner_lives", ["cluster"])
    op.create_index("ix_ds_runner_lives_holder", "ds_runner_lives", ["holder"])


def downgrade() -> None:
    op.drop_index("ix_ds_runner_lives_holder", "ds_runner_lives")
    op.drop_index("ix_ds_runner_lives_cluster", "ds_runner_lives")
    op.drop_table("ds_runner_lives")
