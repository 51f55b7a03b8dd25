"""One trial of a job's results as a row (`TrialRow`): its parameters, architecture, every
metric, outcome, training settings and curve, as `results` reads it from Optuna's tables and
`profiles`, the analyses and the API's read schemas consume it. Plain data: below `results`
(which builds the rows and re-exports `TrialRow`) and `profiles` (which reads them), so that
neither imports the other's module for it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from nas_service.search.numbers import finite_or_none as _loss_or_none
from nas_service.search.numbers import is_finite
from nas_service.spec.space import encode_residual
from nas_service.store import TrialOutcome, TrialStatus
from nas_service.store.records import (
    ConfirmRecord,
    RungRecord,
    SettingRecord,
    TrainRun,
    TrialRead,
)

_TRIAL_JSON = TypeAdapter(TrialRead)


def encode(read: TrialRead) -> bytes:
    """A trial's read as the API sends it: FastAPI's own encoding of `TrialRead`."""
    return _TRIAL_JSON.dump_json(read, by_alias=True)


#: A training setting as a hashable key (its items sorted).
SettingKey = tuple[tuple[str, float], ...]


def setting_key(setting: dict[str, float]) -> SettingKey:
    return tuple(sorted((str(k), float(v)) for k, v in setting.items()))


@dataclass
class TrialRow:
    number: int
    state: TrialStatus
    outcome: TrialOutcome | str  # "" for a trial finished without an outcome (not the runner's)
    reason: str
    params: dict[str, Any]
    arch: dict[str, Any]
    metrics: dict[str, float]
    values: list[float] | None
    train: list[TrainRun]
    curve: list[list[float]]
    lost: bool
    duration_s: float | None
    budget: float | None = None  # FLOPs or tokens the trial was trained with
    trial_id: int = -1  # Optuna's storage id (for incremental refreshes)
    #: the chosen training setting (every axis's effective value; {} for older trials)
    setting: dict[str, float] = field(default_factory=dict)
    #: every setting tried: {"setting", "losses" (per seed, None where not finite), "mean"}
    settings: list[SettingRecord] = field(default_factory=list)
    #: the chosen setting's final validation loss per seed that scores it, in seed order:
    #: the confirmation seeds where the job confirms (`confirm`), else the tuning seeds
    seeds: list[float | None] = field(default_factory=list)
    #: held-out confirmation of the chosen setting (None: the job does not confirm, or the
    #: trial has not reached it)
    confirm: ConfirmRecord | None = None
    #: multi-fidelity: every rung trained ({rung, fraction, loss, promoted, ...}), and the
    #: rung the trial waits at for promotion (None: training, or done)
    rungs: list[RungRecord] = field(default_factory=list)
    waiting: int | None = None
    retry_of: int | None = None  # the lost trial this one retries
    suspect: int | None = None  # suspect stops in a row of its candidate (recovery's count)
    #: the chosen setting's seed statistics (mean, std, min, max; None: not finished)
    seed_stats: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self.state = TrialStatus(self.state)  # a plain string of the vocabulary is taken too
        if not self.settings and self.state == TrialStatus.COMPLETE:
            # a trial from before training settings were recorded: one setting, {}, with the
            # losses of its seeds (or its value)
            loss = _loss_or_none(self.metrics.get("val_loss"))
            losses = list(self.seeds) or ([loss] if loss is not None else [])
            if losses:
                self.settings = [
                    {"setting": dict(self.setting), "losses": losses, "mean": _mean(losses)}
                ]
        if not self.seeds and self.state == TrialStatus.COMPLETE:
            chosen = setting_key(self.setting)
            for entry in self.settings:
                if setting_key(entry["setting"]) == chosen:
                    self.seeds = list(entry["losses"])
                    break

    @property
    def seed_ids(self) -> list[int]:
        """The number of each seed of `seeds`: the confirmation seeds', else 0, 1, …"""
        if self.confirm is not None:
            return list(self.confirm["seeds"])
        return list(range(len(self.seeds)))

    @property
    def confirmed(self) -> bool:
        """Whether `seeds` are held-out confirmation seeds (not those that chose the setting)."""
        return self.confirm is not None

    @property
    def variant(self) -> str:
        return str(self.arch.get("variant", "")) if self.arch else ""

    @functools.cached_property
    def residual(self) -> str:
        """The variant as comparisons name it: with its block size where it has one
        (`block_attnres/S=4`, `spec.space.encode_residual`). Computed once: a row's
        architecture is never changed."""
        variant = self.variant
        try:
            return encode_residual(variant, self.arch)
        except KeyError:  # an architecture recorded without its block size
            return variant

    @property
    def shape_key(self) -> tuple[str, int, int, int, float | None]:
        """(variant label, n_layers, d_model, n_heads, budget): what a shape is matched by
        (n_layers, d_model, n_heads 0 where the architecture lacks them)."""
        a = self.arch
        return (
            self.residual,
            int(a.get("n_layers", 0)),
            int(a.get("d_model", 0)),
            int(a.get("n_heads", 0)),
            self.budget,
        )

    @functools.cached_property
    def arch_key(self) -> tuple[Any, ...]:
        """The architecture without training, and the budget: the unit of a profile. A trial
        without a recorded architecture is its own. Computed once (profiles ask it of every
        trial, several times per answer)."""
        if not self.arch:
            return ("trial", self.number, self.budget)
        return (tuple(sorted((k, _hashable(v)) for k, v in self.arch.items())), self.budget)

    def read(self, curve: bool = False) -> TrialRead:
        """The row as the API shows it (with its curve or not)."""
        return TrialRead.model_validate(self.as_dict(curve))

    @functools.cached_property
    def read_json(self) -> bytes:
        """`read()` as the API sends it, encoded once, on the first page that shows the row (a
        row is never changed: a refresh builds a new one for a trial that changed), so
        polling clients do not validate and encode the same rows again and again. The bytes
        are about a fifth of what the row holds; the table's size (`cache.table_bytes`)
        counts them as if every row had been shown."""
        return encode(self.read())

    def as_dict(self, curve: bool = False) -> dict[str, Any]:
        out = {
            "number": self.number,
            "state": self.state,
            "outcome": self.outcome,
            "reason": self.reason,
            "variant": self.variant,
            "params": self.params,
            "arch": self.arch,
            "metrics": self.metrics,
            "values": self.values,
            "train": self.train,
            "duration_s": self.duration_s,
            "budget": self.budget,
            "setting": self.setting,
            "settings": self.settings,
            "seeds": self.seeds,
            "confirm": self.confirm,
            "rungs": self.rungs,
            "waiting": self.waiting,
            "seed_stats": self.seed_stats,
            "lost": self.lost,
            "retry_of": self.retry_of,
            "suspect": self.suspect,
        }
        if curve:
            out["curve"] = self.curve
        return out


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _mean(losses: list[float | None]) -> float | None:
    """The mean of per-seed losses, None when any is missing (a run diverged)."""
    if not losses or any(not is_finite(v) for v in losses):
        return None
    return float(sum(v for v in losses if v is not None) / len(losses))
