"""The stored records the service's parts share: the attributes the runner writes on a
trial (`TrialAttr`, every key named once), a trial as it is read back (its runs, rungs and
settings), and a job recorded as a landscape, the file a simulated run replays. The runner
(`nas_service.runner`, `nas_service.search`) writes them; the results (`nas_service.results`)
and the simulated backend (`nas_service.runner.simulated`) read them; the API shows them as
they are (`TrialRead` is the trial of `/v1/jobs/{id}/trials`)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

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
    SEEDS = "val_loss_seeds"  # the chosen setting's `SeedStats` (of its scored seeds)
    CONFIRM = "confirm"  # held-out confirmation of the chosen setting: a `ConfirmRecord`
    BPB = "val_bpb"  # the val_loss objective in bits per byte (None: no text)
    RUNGS = "rungs"  # multi-fidelity: per rung trained, a `RungRecord`
    WAITING = "waiting"  # the rung a trial waits at for promotion; None while it trains
    LOST = "ds_lost"  # failed by a crash of the service and re-enqueued: does not count
    RETRY_OF = "ds_retry_of"  # the number of the lost trial this one retries
    SUSPECT = "ds_suspect"  # suspect stops in a row of this candidate so far


class StudyAttr(enum.StrEnum):
    """The key of every Optuna user attribute the service writes on a study."""

    OBJECTIVES = "objectives"


class TrainRun(TypedDict, total=False):
    """One run (a setting × a seed) as the `train` attribute keeps it: the worker's result
    (`search.study.train_summary`, non-finite losses as None), then the seed, setting, rung
    and evaluation curve the runner adds. An older record may lack any field."""

    status: str  # completed | stopped | diverged
    reason: str
    final_val_loss: float | None
    best_val_loss: float | None
    final_val_bpb: float | None  # bits per byte of the validation text (None: raw tokens)
    best_val_bpb: float | None
    steps: int
    tokens_seen: int
    flops_spent: float
    flops_budget: float | None
    wall_time_s: float
    tokens_per_s: float
    peak_memory_bytes: int
    memory_kind: str  # cuda_max_allocated | cpu_peak_rss
    device: str  # cpu | cuda
    device_name: str  # "cpu", or the CUDA device's name
    saved_tensor_bytes: int  # activation memory autograd saved in the first step
    state_bytes: int  # parameters, gradients and optimizer state
    peak_rss_bytes: int  # the worker process's peak resident set
    corpus: dict[str, Any]  # the corpus's identity (name, checksum, sizes)
    seed: int
    setting: dict[str, float]
    rung: int  # multi-fidelity: the rung this run trained (0 without)
    curve: list[list[float]]  # [step, tokens, flops, val_loss] rows


class SettingRecord(TypedDict):
    """One training setting tried (`settings`): its final loss per seed (None where not
    finite or diverged) and their mean (None when any run diverged)."""

    setting: dict[str, float]
    losses: list[float | None]
    mean: float | None


class SeedStats(TypedDict):
    """The chosen setting's final losses over the seeds that score it (`val_loss_seeds`:
    the confirmation seeds where the job confirms, else the tuning seeds): their statistics,
    the values (the finite ones, in seed order) and, with confirmation, the seeds' numbers."""

    mean: float
    std: float
    min: float
    max: float
    values: NotRequired[list[float]]
    seeds: NotRequired[list[int]]


class ConfirmRecord(TypedDict):
    """Held-out confirmation (`confirm`): the setting chosen on the tuning seeds, the
    confirmation seeds' numbers (numbered on from the tuning seeds, the same in every trial),
    its final loss on each (None where not finite or diverged) and their mean (None when any
    is None)."""

    setting: dict[str, float]
    seeds: list[int]
    losses: list[float | None]
    mean: float | None


class RungRecord(TypedDict):
    """A rung a trial trained (`rungs`, multi-fidelity): its share of the budget, its loss
    (the best setting's mean over seeds), its objective vector, the main line's steps and
    tokens, the settings that diverged there, and whether it went on to the next rung."""

    rung: int
    fraction: float
    loss: float
    values: list[float]
    steps: int
    tokens: int
    given_up: NotRequired[list[int]]
    promoted: bool


#: The `TrialRead` field that shows an attribute, where it is not the attribute's
#: `TrialRecord` field of the same name: the costs and bits per byte are metrics.
SHOWN_AS = {TrialAttr.COSTS: "metrics", TrialAttr.BPB: "metrics", TrialAttr.SEEDS: "seed_stats"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """What the service writes on a trial, typed: each field is the `TrialAttr` of its name
    (`seeds` is `TrialAttr.SEEDS`, stored as `val_loss_seeds`). A record holds what one
    write sets (a field left None is not written: it stays as stored), and `nulls` the
    attributes it writes as null (a trial that no longer waits, a loss without bits per
    byte); `from_attrs` reads a trial's attributes back (a null read back goes to `nulls`)."""

    arch: dict[str, Any] | None = None
    costs: dict[str, float] | None = None
    outcome: str | None = None
    reason: str | None = None
    train: list[TrainRun] | None = None
    curve: list[list[float]] | None = None
    setting: dict[str, float] | None = None
    settings: list[SettingRecord] | None = None
    seeds: SeedStats | None = None
    confirm: ConfirmRecord | None = None
    bpb: float | None = None
    rungs: list[RungRecord] | None = None
    waiting: int | None = None
    lost: bool | None = None
    retry_of: int | None = None
    suspect: int | None = None
    nulls: frozenset[TrialAttr] = frozenset()

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes to write: every field set, and `nulls` as null."""
        out: dict[str, Any] = {}
        for key, name in _FIELD_OF.items():
            value = getattr(self, name)
            if value is not None:
                out[key] = value
            elif key in self.nulls:
                out[key] = None
        return out

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """A trial's record from its user attributes; keys the service never writes, and
        a `waiting` or `rungs` not of the written shape, are left out."""
        values: dict[str, Any] = {}
        nulls: list[TrialAttr] = []
        for key, value in attrs.items():  # a trial's few attributes: read once per trial
            name = _FIELD_OF.get(key)
            if name is None:
                continue
            if value is None:
                nulls.append(TrialAttr(key))
            else:
                values[name] = value
        waiting = values.get("waiting")
        if waiting is not None and (not isinstance(waiting, int) or isinstance(waiting, bool)):
            del values["waiting"]
        if "rungs" in values:
            values["rungs"] = rung_records(values["rungs"])
        return cls(**values, nulls=frozenset(nulls)) if nulls else cls(**values)


#: Every attribute key → its `TrialRecord` field.
_FIELD_OF = {key.value: key.name.lower() for key in TrialAttr}


def rung_records(value: Any) -> list[RungRecord]:
    """The `rungs` attribute's records (none when it is not a list; entries that are not
    records left out)."""
    kept = [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []
    return cast(list[RungRecord], kept)


class TrainRunRead(BaseModel):
    """One run as a trial keeps it (`TrainRun`: `search.train_summary`, its seed, setting,
    rung and curve). A field missing from an older record is null."""

    status: str | None = None  # completed | stopped | diverged
    reason: str | None = None
    final_val_loss: float | None = None  # null when not finite
    best_val_loss: float | None = None
    final_val_bpb: float | None = None  # bits per byte (null: a corpus of raw tokens)
    best_val_bpb: float | None = None
    steps: int | None = None
    tokens_seen: int | None = None
    flops_spent: float | None = None
    flops_budget: float | None = None
    wall_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None  # cuda_max_allocated | cpu_peak_rss
    device: str | None = None
    device_name: str | None = None  # "cpu", or the CUDA device's name
    saved_tensor_bytes: int | None = None  # activation memory saved for backward (1st step)
    state_bytes: int | None = None  # parameters, gradients and optimizer state
    peak_rss_bytes: int | None = None  # the worker process's peak resident set
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


class ConfirmRead(BaseModel):
    """Held-out confirmation: the setting chosen on the tuning seeds, the confirmation seeds'
    numbers, its final validation loss on each (null where not finite or diverged) and their
    mean (null when any is null). The trial's value, profile and comparisons use these."""

    setting: dict[str, float]
    seeds: list[int]
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
    #: the chosen setting's final validation loss per seed that scores it: the confirmation
    #: seeds (`confirm.seeds` numbers them) where the job confirms, else the tuning seeds
    #: (index = seed)
    seeds: list[float | None] = Field(default_factory=list)
    #: held-out confirmation of the chosen setting (null: the job does not confirm, or the
    #: trial has not reached it)
    confirm: ConfirmRead | None = None
    #: multi-fidelity: every rung trained, and the rung it waits at (null: training or done)
    rungs: list[RungRead] = Field(default_factory=list)
    waiting: int | None = None
    #: the chosen setting's seed statistics: mean, std, min, max (null: not finished)
    seed_stats: dict[str, float] | None = None
    #: lost in a crash of the service and retried (it does not count), the trial this one
    #: retries, and the suspect stops in a row of its candidate (recovery's count)
    lost: bool = False
    retry_of: int | None = None
    suspect: int | None = None


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
