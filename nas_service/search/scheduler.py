"""What a free slot of a job does next: the scheduler contract and its two schedulers.

The runner (`nas_service.runner.loop`) keeps up to `max_concurrent` trials of a job in flight.
At the start of each pass it shows the job's scheduler the study (`observe`); then, for every
free slot, `next_slot` answers with one of

- `Start`: ask the study for a new candidate (it trains from rung `first_rung(number)`);
- `Resume`: train the next rung of a trial waiting at a rung (promoted now);
- None: nothing for this slot (the job's `n_trials` are counted, in flight or waiting).

After the pass, `settle` names the waiting trials to tell pruned (none can ever go on). The
scheduler also says how a trial's run at a rung looks (`run_of`), what a finished rung
records (`rung_record`), and which pruner the study gets (`make_pruner`).

`scheduler_for(spec)` chooses: `FIFO` (the default, one fidelity: every candidate trains its
whole budget, pruned by the study's pruner on its intermediate losses) or, with a `fidelity`
section, `SuccessiveHalving` (ASHA with Hyperband brackets, `nas_service.search.rungs`: a slot
promotes the best waiting trial of the highest rung first and asks a new trial only when none
can go on). It is the one place that tells the two apart."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from nas_service.search.fidelity import bracket_of
from nas_service.search.optimum import located, shape_points
from nas_service.search.pruning import FractionMedianPruner
from nas_service.search.rungs import (
    Ladder,
    Waiting,
    describe_fidelity,
    expected_compute,
    leftover_reason,
    rung_progress,
    rung_spec,
)
from nas_service.spec import LOSS, Fidelity, JobSpec
from nas_service.store.records import RungRecord
from workers.contract import TrainSpec


@dataclass(frozen=True)
class Start:
    """Ask the study for a new candidate."""


@dataclass(frozen=True)
class Resume:
    """Train rung `rung` of a trial that waited at the rung before (promoted)."""

    waiting: Waiting

    @property
    def rung(self) -> int:
        return self.waiting.rung + 1


Slot = Start | Resume | None


class Scheduler(ABC):
    """One job's scheduler (see the module's docstring)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        #: Why the job may end before `n_trials` (`stop`), as last observed; None until then.
        self.answered: str | None = None
        self._fitted_at = -1  # the completed trials the last fit saw

    #: How many rungs a trial passes (1: its whole budget at once).
    rungs: int = 1
    #: Whether trials wait between rungs (then the job has checkpoints to delete and trials
    #: to conclude when it is cancelled).
    pauses: bool = False

    @property
    def waiting(self) -> list[Waiting]:
        """The trials waiting for promotion, as last observed (less those resumed since)."""
        return []

    def observe(self, study: optuna.Study, in_flight: set[int]) -> None:
        """Read the job's state before answering its slots (`in_flight`: the trial numbers
        training now); with `stop`, whether the job's question is answered (`answered`)."""
        if self.spec.stop is None:
            return
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if len(done) != self._fitted_at:  # a fit per newly completed trial, not per pass
            self._fitted_at = len(done)
            self.answered = optimum_located(self.spec, done)

    @abstractmethod
    def next_slot(self, counted: int, in_flight: int) -> Slot:
        """What a free slot does next, given the trials counted and those in flight."""

    def settle(self, idle: bool) -> list[tuple[Waiting, str]]:
        """The waiting trials to tell pruned now, with the reason (no longer waiting);
        `idle`: the job has nothing in flight."""
        return []

    def start_note(self) -> str:
        """What the job's start event adds about the schedule."""
        return ""

    def first_rung(self, number: int) -> int:
        """The rung trial `number` starts at."""
        return 0

    def run_of(
        self,
        base: TrainSpec,
        rung: int,
        first: int,
        key: Callable[[int], str],
        store: str,
        max_checkpoint_bytes: int = 1 << 30,
    ) -> TrainSpec:
        """The run of rung `rung` of a candidate's `base` run (a trial that started at rung
        `first`); `key(rung)` names a checkpoint of it."""
        return base

    def rung_record(
        self,
        rung: int,
        loss: float,
        values: list[float],
        steps: int,
        tokens: int,
        given_up: list[int],
    ) -> RungRecord | None:
        """The record a trial keeps of a finished rung (None: the trial keeps none)."""
        return None

    def prunes_points(self) -> bool:
        """Whether a trial's intermediate losses may prune it (else the rungs decide)."""
        return True

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """The study's pruner."""
        return optuna.pruners.NopPruner()

    def expected_compute(self) -> float:
        """The mean compute of one candidate in units of its straight run."""
        return 1.0

    def progress(self, rows: list[Any]) -> list[dict[str, Any]]:
        """Per rung: the trials that reached it, train it, wait at it, were promoted from it
        (`rows`: the job's `results.TrialRow`s, not lost)."""
        return []


def optimum_located(spec: JobSpec, completed: Sequence[optuna.trial.FrozenTrial]) -> str | None:
    """Whether every variant of the space has its loss-optimal d_model/L_b inside the explored
    shapes with a 90% interval at most `stop.optimum_interval` wide in ln(d_model/L_b), fitted
    as the results fit it (`search.optimum.fit_optimum` on each trial's scored loss, one point
    per trained architecture, six points at least: `search.optimum.located`); the message
    saying so, else None."""
    assert spec.stop is not None
    width = spec.stop.optimum_interval
    points = shape_points(completed, spec.objectives.index(LOSS))
    fits = located(points, spec.space.variants, width)
    if fits is None:
        return None
    return f"every variant's optimum d_model/L_b is located to ln-width ≤ {width:g}: " + "; ".join(
        f"{fit.variant} {fit.optimum_ratio:.3g} [{fit.ci_low:.3g}, {fit.ci_high:.3g}] "
        f"(ln-width {math.log(fit.ci_high / fit.ci_low):.2f})"
        for fit in fits
        if fit.ci_low and fit.ci_high
    )


class FIFO(Scheduler):
    """One fidelity: every slot starts a new candidate until `n_trials` are counted or in
    flight; the study's pruner stops the hopeless on their intermediate losses."""

    def next_slot(self, counted: int, in_flight: int) -> Slot:
        if self.answered is not None:
            return None
        return Start() if counted + in_flight < self.spec.n_trials else None

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """Single objective: `auto` is the median rule at equal fractions of the budget,
        with a warm-up and a minimum of completed peers (`pruning.FractionMedianPruner`; the
        runner reports at `study.report_step`); `median` is Optuna's `MedianPruner` at raw
        optimizer steps, the naive rule (a trial meets only trials of its own step count).
        Multi-objective jobs are pruned by the runner with `study.cannot_reach_front`
        (Optuna's pruners refuse several objectives)."""
        spec = self.spec
        if spec.multi_objective:
            return optuna.pruners.NopPruner()
        if spec.pruner == "auto":
            return FractionMedianPruner()
        if spec.pruner == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
        return optuna.pruners.NopPruner()


class SuccessiveHalving(Scheduler):
    """ASHA with Hyperband brackets over the rungs of `fidelity` (`nas_service.search.rungs`):
    a slot promotes the best waiting trial of the highest rung first and starts a new trial
    only when none can go on and fewer than `n_trials` are counted, in flight or waiting.
    The rungs alone decide which candidates go on (the study's pruner does nothing)."""

    pauses = True

    def __init__(self, spec: JobSpec, fidelity: Fidelity):
        super().__init__(spec)
        self.fidelity = fidelity
        self.rungs = len(fidelity.rungs)
        self._ladder: Ladder | None = None

    @property
    def waiting(self) -> list[Waiting]:
        return self._ladder.waiting if self._ladder is not None else []

    def observe(self, study: optuna.Study, in_flight: set[int]) -> None:
        super().observe(study, in_flight)
        trials = study.get_trials(deepcopy=False)
        self._ladder = Ladder.of(self.fidelity, trials, in_flight)

    def _promotion(self) -> Waiting | None:
        return self._ladder.next_promotion(self.rungs - 1) if self._ladder is not None else None

    def next_slot(self, counted: int, in_flight: int) -> Slot:
        promotion = self._promotion()
        if promotion is not None:
            assert self._ladder is not None
            self._ladder.promote(promotion)
            return Resume(promotion)
        if counted + in_flight + len(self.waiting) >= self.spec.n_trials:
            return None
        return Start()

    def settle(self, idle: bool) -> list[tuple[Waiting, str]]:
        """The waiting trials that can never be promoted, and, when the job has nothing in
        flight and nothing left to ask (`idle`), every one still waiting: no result can
        arrive that would promote it."""
        ladder = self._ladder
        if ladder is None or not ladder.waiting:
            return []
        stop = ladder.hopeless(self.spec.n_trials)
        if idle and not stop and self._promotion() is None:
            stop = [(w, leftover_reason(w, ladder)) for w in ladder.waiting]
        for w, _ in stop:
            ladder.waiting.remove(w)
        return stop

    def start_note(self) -> str:
        return f"; {describe_fidelity(self.fidelity)}"

    def first_rung(self, number: int) -> int:
        return bracket_of(number, self.fidelity)

    def run_of(
        self,
        base: TrainSpec,
        rung: int,
        first: int,
        key: Callable[[int], str],
        store: str,
        max_checkpoint_bytes: int = 1 << 30,
    ) -> TrainSpec:
        return rung_spec(base, self.fidelity, rung, first, key, store, max_checkpoint_bytes)

    def rung_record(
        self,
        rung: int,
        loss: float,
        values: list[float],
        steps: int,
        tokens: int,
        given_up: list[int],
    ) -> RungRecord | None:
        return {
            "rung": rung,
            "fraction": float(self.fidelity.rungs[rung]),
            "loss": loss,
            "values": values,
            "steps": steps,
            "tokens": tokens,
            "given_up": given_up,
            "promoted": False,
        }

    def prunes_points(self) -> bool:
        return False

    def expected_compute(self) -> float:
        return expected_compute(self.fidelity)

    def progress(self, rows: list[Any]) -> list[dict[str, Any]]:
        return rung_progress(self.fidelity, rows)


def scheduler_for(spec: JobSpec) -> Scheduler:
    """The job's scheduler: successive halving with a `fidelity` section, else FIFO."""
    fidelity = spec.fidelity
    if fidelity is None:
        return FIFO(spec)
    return SuccessiveHalving(spec, fidelity)


def make_pruner(spec: JobSpec) -> optuna.pruners.BasePruner:
    """The study's pruner for the job (`Scheduler.make_pruner`)."""
    return scheduler_for(spec).make_pruner()
