"""jobs, job events and trial runs

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ds_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("study_name", sa.String(64), nullable=False, unique=True),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_ds_jobs_status", "ds_jobs", ["status"])
    op.create_table(
        "ds_job_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.String(36), sa.ForeignKey("ds_jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
    )
    op.create_index("ix_ds_job_events_job_id", "ds_job_events", ["job_id"])
    op.create_table(
        "ds_trial_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.String(36), sa.ForeignKey("ds_jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_ds_trial_runs_job_trial", "ds_trial_runs", ["job_id", "trial_number"])
    op.create_index("ix_ds_trial_runs_state", "ds_trial_runs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_ds_trial_runs_state", table_name="ds_trial_runs")
    op.drop_index("ix_ds_trial_runs_job_trial", table_name="ds_trial_runs")
    op.drop_table("ds_trial_runs")
    op.drop_index("ix_ds_job_events_job_id", table_name="ds_job_events")
    op.drop_table("ds_job_events")
    op.drop_index("ix_ds_jobs_status", table_name="ds_jobs")
    op.drop_table("ds_jobs")
