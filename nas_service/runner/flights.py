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
from nas_service.search.study import chosen_setting, curve_rows, train_summary
from nas_service.spec import JobSpec
from nas_service.store.records import ConfirmRecord, RungRecord, SettingRecord, TrainRun
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
    """One trial in flight: its candidate, its plan of runs (every setting × every tuning
    seed, setting-major; then, with `confirm` at the trial's last rung, the chosen setting
    on each confirmation seed), the run being trained (`index` into `plan`) and what came
    back."""

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
    def confirming(self) -> bool:
        """Whether the flight ends with confirmation runs: the last rung of a job whose spec
        has `confirm`."""
        return self.spec.confirm is not None and self.last_rung

    @property
    def plan(self) -> list[tuple[int, int]]:
        """(setting, seed) of every run, in the order they are trained. A confirmation run's
        setting is the one `chosen` on the tuning seeds (-1 until the tuning runs are done,
        and when every setting diverged there: such a run is never trained); its seed is
        numbered on from the tuning seeds."""
        spec = self.spec
        plan = [(s, k) for s in range(len(self.settings)) for k in range(spec.seeds)]
        if self.confirming:
            chosen = self.chosen() if self._tuned() else None
            s = -1 if chosen is None else chosen
            plan += [(s, spec.seeds + j) for j in range(spec.confirm_seeds)]
        return plan

    def is_confirmation(self) -> bool:
        """Whether the run being trained is a confirmation run."""
        return self.seed >= self.spec.seeds

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
            (
                i
                for i in range(self.index + 1, len(plan))
                if plan[i][0] >= 0 and plan[i][0] not in self.given_up
            ),
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

    def _losses(self) -> dict[tuple[int, int], float | None]:
        """Each finished run's final loss by (setting, seed): None where not finite or
        diverged."""
        losses: dict[tuple[int, int], float | None] = {}
        for r in self.runs:
            loss = r.result.final_val_loss
            ok = r.result.status != "diverged" and math.isfinite(loss)
            losses[r.setting, r.seed] = loss if ok else None
        return losses

    def table(self) -> list[SettingRecord]:
        """The `settings` attribute: per setting, its tuning seeds' final losses and their
        mean."""
        losses = self._losses()
        rows: list[SettingRecord] = []
        for s, setting in enumerate(self.settings):
            seeds = [losses.get((s, k)) for k in range(self.spec.seeds)]
            rows.append({"setting": setting, "losses": seeds, "mean": _mean(seeds)})
        return rows

    def _tuned(self) -> bool:
        """Whether every setting has finished its tuning seeds or was given up."""
        losses, seeds = self._losses(), range(self.spec.seeds)
        return all(
            s in self.given_up or all((s, k) in losses for k in seeds)
            for s in range(len(self.settings))
        )

    def chosen(self) -> int | None:
        """The setting of lowest mean loss on the tuning seeds (the first of equal means;
        None when every setting diverged or none has finished its seeds)."""
        return chosen_setting(self.table())

    def confirmation(self) -> ConfirmRecord | None:
        """The `confirm` attribute: the chosen setting's final loss on each confirmation seed
        (None where not finite, diverged, or not trained) and their mean (None unless every
        one is finite). None without confirmation, or with no setting chosen."""
        chosen = self.chosen() if self.confirming else None
        if chosen is None:
            return None
        spec, losses = self.spec, self._losses()
        seeds = [spec.seeds + j for j in range(spec.confirm_seeds)]
        values = [losses.get((chosen, k)) for k in seeds]
        return {
            "setting": self.settings[chosen],
            "seeds": seeds,
            "losses": values,
            "mean": _mean(values),
        }


def _mean(values: list[float | None]) -> float | None:
    """The mean of `values`, None when any is None."""
    finite = [x for x in values if x is not None]
    return statistics.fmean(finite) if finite and len(finite) == len(values) else None


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
