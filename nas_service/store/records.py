"""The stored records the service's parts share: the attributes the runner writes on a
trial (`TrialAttr`, every key named once), a trial as it is read back (its runs, rungs and
settings), and a job recorded as a landscape, the file a simulated run replays. The runner
(`nas_service.runner`, `nas_service.search`) writes them; the results (`nas_service.results`)
and the simulated backend (`nas_service.runner.simulated`) read them; the API shows them as
they are (`TrialRead` is the trial of `/v1/jobs/{id}/trials`)."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, Field
from typing_extensions import TypeAliasType

from nas_service.spec import JobSpec
from nas_service.store.tables import JobStatus, TrialStatus

#: A parameter or an architecture field: a number, a string, a flag or nothing.
Scalar = int | float | str | bool | None
#: A value of a nested report (the cost model's sections): scalars, lists and maps of them.
Value = TypeAliasType("Value", "Scalar | list[Value] | dict[str, Value]")


class TrialAttr(enum.StrEnum):
    """The key of every Optuna user attribute the service writes on a trial."""

    ARCH = "arch"  # the candidate's `ArchConfig` fields
    COSTS = "costs"  # the priced metrics (parameters, FLOPs, memory, step time, ...)
    OUTCOME = "outcome"  # a `TrialOutcome`
    REASON = "reason"  # why it ended so ("" when completed)
    TRAIN = "train"  # every run (setting × seed), in the order run: `TrainRun`s
    CURVE = "curve"  # the evaluation curve: [step, tokens, flops, val_loss] rows
    SETTING = "setting"  # the chosen training setting
    SETTINGS = "settings"  # per setting tried: `SettingRecord`s
    SEEDS = "val_loss_seeds"  # the chosen setting's `SeedStats`
    BPB = "val_bpb"  # the val_loss objective in bits per byte (None: no text)
    RUNGS = "rungs"  # multi-fidelity: per rung trained, a `RungRecord`
    WAITING = "waiting"  # the rung a trial waits at for promotion; None while it trains
    LOST = "ds_lost"  # failed by a crash of the service and re-enqueued: does not count
    RETRY_OF = "ds_retry_of"  # the number of the lost trial this one retries
    SUSPECT = "ds_suspect"  # suspect stops in a row of this candidate so far


class StudyAttr(enum.StrEnum):
    """The key of every Optuna user attribute the service writes on a study."""

    OBJECTIVES = "objectives"


class TrainRunRead(BaseModel):
    """One seed's training run as a trial keeps it (`search.train_summary`; the curve is
    kept apart). A field missing from an older record is null."""

    status: str | None = None  # completed | stopped | diverged
    reason: str | None = None
    final_val_loss: float | None = None  # null when not finite
    best_val_loss: float | None = None
    steps: int | None = None
    tokens_seen: int | None = None
    flops_spent: float | None = None
    flops_budget: float | None = None
    wall_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None  # cuda_max_allocated | cpu_peak_rss
    device: str | None = None
    corpus: dict[str, Scalar] | None = None  # the corpus's identity (name, checksum, sizes)
    seed: int | None = None  # the run's seed: seed k of every trial sees the same batches
    setting: dict[str, float] | None = None  # lr, depth_lr_mult, warmup_frac, weight_decay
    rung: int | None = None  # multi-fidelity: the rung this run trained (0-based)
    curve: list[list[float | None]] | None = None  # [step, tokens, flops, val_loss] rows


class RungRead(BaseModel):
    """A rung a trial trained (multi-fidelity): its share of the budget, its loss there (the
    best setting's mean over seeds, after the decay branch of a WSD rung), its objective
    vector, the main line's steps and tokens, and whether it went on to the next rung."""

    rung: int
    fraction: float
    loss: float | None = None
    values: list[float | None] = Field(default_factory=list)
    steps: int | None = None
    tokens: int | None = None
    given_up: list[int] = Field(default_factory=list)  # settings that diverged there
    promoted: bool = False


class SettingRead(BaseModel):
    """One training setting a trial was trained at: its final validation loss per seed
    (null where not finite or diverged) and their mean (null when any run diverged)."""

    setting: dict[str, float]
    losses: list[float | None]
    mean: float | None


class TrialRead(BaseModel):
    """One Optuna trial of a job: its parameters, architecture, metrics and outcome."""

    number: int
    state: TrialStatus
    outcome: str  # a `TrialOutcome`, or "" for a trial finished outside the runner
    reason: str
    variant: str
    params: dict[str, Scalar]
    arch: dict[str, Scalar]  # the `ArchConfig`'s fields; empty when none was built
    metrics: dict[str, float | None]
    values: list[float | None] | None
    train: list[TrainRunRead]  # every run (setting × seed), in the order run
    duration_s: float | None
    budget: float | None
    curve: list[list[float | None]] | None = None
    #: the chosen training setting (a per-shape grid: the best by mean loss over seeds)
    setting: dict[str, float] = Field(default_factory=dict)
    #: every setting tried, with its per-seed losses
    settings: list[SettingRead] = Field(default_factory=list)
    #: the chosen setting's final validation loss per seed (index = seed)
    seeds: list[float | None] = Field(default_factory=list)
    #: multi-fidelity: every rung trained, and the rung it waits at (null: training or done)
    rungs: list[RungRead] = Field(default_factory=list)
    waiting: int | None = None


class LandscapeJobRead(BaseModel):
    id: str
    name: str
    status: JobStatus
    study_name: str
    objectives: list[str]
    spec: JobSpec


class LandscapeRead(BaseModel):
    """A job recorded as a landscape (`nas_service.results.landscape`): its spec and every
    trial with its parameters, architecture, costs, settings and per-seed runs (tokens, FLOPs, wall
    time), and its evaluation curve; the corpus the runs read. What a simulated run of the
    same search replays."""

    format: Literal["depthscope-landscape"]
    version: int
    job: LandscapeJobRead
    corpus: dict[str, Scalar] | None  # the identity every run reported (name, checksum, sizes)
    trials: list[TrialRead]
