"""Response schemas, named by role (`JobRead`, `JobList`, …)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel


class Progress(BaseModel):
    counted: int
    completed: int
    running: int
    pruned: int
    infeasible: int
    failed: int
    diverged: int


class Compute(BaseModel):
    kind: str  # flops | tokens
    spent: float
    budget: float
    fraction: float


class JobRead(BaseModel):
    id: str
    name: str
    status: str
    n_trials: int
    study_name: str
    objectives: list[str]
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    error: str | None
    progress: Progress
    compute: Compute
    eta_s: float | None
    spec: dict[str, Any]


class JobList(BaseModel):
    items: list[JobRead]
    total: int
    limit: int
    offset: int


class TrialList(BaseModel):
    items: list[dict[str, Any]]
    total: int
    limit: int
    offset: int


class ParetoRead(BaseModel):
    metrics: list[str]
    variant: str | None
    n_candidates: int
    front: list[dict[str, Any]]


class OptimumRead(BaseModel):
    job_id: str
    fits: list[dict[str, Any]]


class ScalingRead(BaseModel):
    job_id: str
    fits: dict[str, Any]
    problems: dict[str, str]
    reference: str | None = None
    loss: float | None = None
    multipliers: dict[str, float] | None = None


class CostRequest(BaseModel):
    arch: dict[str, Any]
    workload: dict[str, Any] = {}
    parallelism: dict[str, Any] = {}
    hardware: str = "h100"
