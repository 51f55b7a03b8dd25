"""The trials a runner has in flight: each `Flight` (one trial training its plan of runs, or
one rung of it), and `Flights`, the runner's collection of them: those training now, those
parked after an artifact store fault (launched again at a set time, `runner.parking`), and
those asked in the current pass of the loop whose attributes and run row are not written
yet (`Outcomes.record_asked`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna

from nas_service.search.pricing import Priced
from nas_service.search.scheduler import Scheduler
from nas_service.search.study import curve_rows, train_summary
from nas_service.spec import JobSpec
from nas_service.store.records import RungRecord, SettingRecord, TrainRun
from workers.contract import EvalPoint, TrainResult


@dataclass
class Run:
    """A finished training run of a trial: its setting (an index into the flight's
    settings), its seed and what came back."""

    setting: int
    seed: int
    result: TrainResult


@dataclass
class Flight:
    """One trial in flight: its candidate, its plan of runs (every setting × every seed,
    setting-major), the run being trained (`index` into `plan`) and what came back."""

    job_id: str
    spec: JobSpec
    scheduler: Scheduler
    study: optuna.Study
    trial: optuna.Trial
    priced: Priced
    run_id: int
    settings: list[dict[str, float]] = field(default_factory=lambda: [{}])
    index: int = 0
    attempt: int = 1
    gen: Any = None
    points: list[EvalPoint] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    given_up: set[int] = field(default_factory=set)  # settings a diverged run ended
    next_run_id: int | None = None  # the next run's row, opened before this one's is closed
    rung: int = 0  # the rung trained (multi-fidelity; 0 without: the one and last rung)
    first: int = 0  # the trial's first rung (its Hyperband bracket)
    earlier: list[TrainRun] = field(default_factory=list)  # `train` of earlier rungs
    records: list[RungRecord] = field(default_factory=list)  # `rungs` of earlier rungs

    @property
    def plan(self) -> list[tuple[int, int]]:
        """(setting, seed) of every run, in the order they are trained."""
        return [(s, k) for s in range(len(self.settings)) for k in range(self.spec.seeds)]

    @property
    def setting(self) -> int:
        return self.plan[self.index][0]

    @property
    def seed(self) -> int:
        return self.plan[self.index][1]

    @property
    def tuned(self) -> bool:
        """Whether the trial trains at several settings (a `tune` grid)."""
        return len(self.settings) > 1

    def next_index(self) -> int | None:
        """The next run of the plan whose setting has not been given up, if any."""
        plan = self.plan
        return next(
            (i for i in range(self.index + 1, len(plan)) if plan[i][0] not in self.given_up),
            None,
        )

    @property
    def last_rung(self) -> bool:
        return self.rung == self.scheduler.rungs - 1

    def summaries(self) -> list[TrainRun]:
        """The `train` attribute: every finished run's summary (earlier rungs' first), its
        seed, setting, rung and evaluation curve."""
        return self.earlier + [
            train_summary(r.result)
            | {
                "seed": r.seed,
                "setting": self.settings[r.setting],
                "rung": self.rung,
                "curve": curve_rows(r.result.curve),
            }
            for r in self.runs
        ]

    def table(self) -> list[SettingRecord]:
        """The `settings` attribute: per setting, its seeds' final losses and their mean."""
        losses: dict[tuple[int, int], float | None] = {}
        for r in self.runs:
            loss = r.result.final_val_loss
            ok = r.result.status != "diverged" and math.isfinite(loss)
            losses[r.setting, r.seed] = loss if ok else None
        rows: list[SettingRecord] = []
        for s, setting in enumerate(self.settings):
            seeds = [losses.get((s, k)) for k in range(self.spec.seeds)]
            finite = [x for x in seeds if x is not None]
            mean = statistics.fmean(finite) if len(finite) == len(seeds) else None
            rows.append({"setting": setting, "losses": seeds, "mean": mean})
        return rows


class Flights:
    """The runner's trials in flight (iterating, `in` and truth read those training now),
    `parked` (monotonic time of the next launch, flight) and `unrecorded` (flight, its
    attributes to write)."""

    def __init__(self) -> None:
        self.flying: list[Flight] = []
        self.parked: list[tuple[float, Flight]] = []
        self.unrecorded: list[tuple[Flight, dict[str, Any]]] = []

    def __iter__(self) -> Iterator[Flight]:
        return iter(list(self.flying))

    def __len__(self) -> int:
        return len(self.flying)

    def __bool__(self) -> bool:
        return bool(self.flying)

    def __contains__(self, flight: object) -> bool:
        return flight in self.flying

    def add(self, flight: Flight) -> None:
        self.flying.append(flight)

    def drop(self, flight: Flight) -> None:
        """The flight no longer trains (told, paused or parked)."""
        if flight in self.flying:
            self.flying.remove(flight)

    def of(self, job_id: str) -> list[Flight]:
        """The job's flights training now."""
        return [f for f in self.flying if f.job_id == job_id]

    def jobs(self) -> set[str]:
        """The jobs with a flight training or parked."""
        return {f.job_id for f in self.flying} | {f.job_id for _, f in self.parked}

    def unpark(self, job_id: str) -> list[Flight]:
        """The job's parked flights, no longer parked."""
        mine = [f for _, f in self.parked if f.job_id == job_id]
        self.parked = [(at, f) for at, f in self.parked if f.job_id != job_id]
        return mine

    def clear(self) -> None:
        """Forget every flight (a runner that lost its lease tells nothing)."""
        self.flying.clear()
        self.parked.clear()
        self.unrecorded = []
