"""A simulated execution backend: the `Backend` protocol (`nas_service.runner.backend`) answered
from a recorded landscape (`nas_service.results.landscape`) on a simulated clock, without Ray and
without torch, so the real runner, sampler, pruner, fidelity logic and database can be
measured on thousands of workers, or replay a search in seconds.

What a run trains is looked up, never fitted: the *nearest recorded point* (no surrogate
model of the loss surface).

- The trial: same variant and block size as the run's architecture (none recorded: the run
  fails with `SimulatedLookupError`, not retried), then the nearest depth and width by
  |ln n_layers/n'| + |ln d_model/d'|.
- Its setting, among every setting recorded for that architecture (one trial per setting
  when a training axis was searched jointly): exact on `warmup_frac` and `weight_decay`
  when recorded, then nearest by |ln lr/lr'| + |ln depth_lr_mult/m'| (a variant without depth
  mixing, outside `cost_model.residuals.DEPTH_MIXED`, ignores `depth_lr_mult`).
- Its run: the one of the spec's seed, seed 0 when that seed was not recorded.

The loss curve of that run: its own when the landscape kept one per run (`train[i].curve`),
else the trial's curve (the chosen setting's seed 0) scaled by final_run / final_chosen (a
*surrogate*: the shape of one curve with another run's end point; the run's own final loss
is returned exactly). The curve is L(x), x the fraction of the recorded run's tokens,
interpolated linearly between (0, ln vocab) and the recorded points. The landscape is read
as a full-budget job's (runs of a multi-fidelity job's lower rungs are not told apart), and
under its own schedule: a WSD run replayed on a cosine landscape gets the cosine curve.

A run's main line has T = `spec.planned_steps()` steps and covers the fraction f of the
recorded run: T / T_recorded for the recorded architecture (cosine rungs that retrain on a
share of the budget), the ratio of planned to recorded compute for a nearest one; f ≤ 1 (a
budget above the recorded one gets the recorded end). The main line's evaluations lie at the
recorded curve's fractions of T, with the loss L(f · step / T). A segment (`start_step`,
`stop_step` of `workers.contract.TrainSpec`) streams the main-line points in (start, stop];
its `final_val_loss` is L(f · stop / T) (the decay branch is not simulated apart: the
recorded curve's value there), and it trains (stop − start + branch_steps) steps. Training
losses are not recorded: `train_loss` repeats the validation loss.

The clock. A run takes the recorded run's wall time × the tokens this run trains / the
recorded run's tokens (or `duration_s` per full main line when given), its items arrive at
their share of that time (an evaluation at step s: (s − start) / trained steps). `workers`
simulated workers run one run each; launches beyond them queue FIFO (as Ray queues tasks)
and start when a worker frees (a run ends, is cancelled or loses its worker). Simulated time
advances with the real time the runner spends between calls (× `overhead_scale`), so the
runner's own overhead costs simulated time and idles the workers it has not yet refilled
(what `utilisation` measures), and `wait` jumps the clock to the earliest next item of the
handles it is given instead of sleeping (its timeout never passes in simulated time).

Counters: `runs_launched`, `busy_s` (worker-seconds), `makespan_s`, `utilisation` = busy /
(workers × makespan), `compute_spent` (FLOPs trained, partial runs included: a run trains at
a constant rate), and `events`, the log a benchmark reads (`SimEvent`: simulated time,
cumulative compute, the run's identity, its final loss). Fault injection: `lose_every=k`
makes every k-th launched run lose its worker halfway (`SimulatedWorkerLost`, retryable).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cost_model.flops import training_flops_per_token
from nas_service.runner.recorded import SimulatedLookupError as SimulatedLookupError
from nas_service.runner.recorded import (
    curve_of,
    interp,
    nearest,
    nearest_setting,
    record,
    trainable,
)
from nas_service.store.records import LandscapeRead
from workers.contract import EvalPoint, TrainResult, TrainSpec

Item = EvalPoint | TrainResult | BaseException


class SimulatedWorkerLost(RuntimeError):
    """A simulated worker died under its run (fault injection): the runner retries it."""


@dataclass
class SimEvent:
    """One end of a run in the log: `kind` completed | cancelled | lost | failed, at `time`
    (simulated seconds), with the FLOPs trained by every run until then (`compute`), the
    run's `identity` (its architecture, setting, seed, segment, the landscape trial it was
    answered from), and its final loss when it completed. `full`: a completed run that
    trained its candidate's whole budget (not a shorter rung)."""

    time: float
    compute: float
    kind: str
    run: int
    identity: dict[str, Any]
    loss: float | None = None
    full: bool = False


@dataclass
class _Run:
    """One launched run: its answer (items at fractions of its duration) and its state."""

    number: int
    spec: TrainSpec
    identity: dict[str, Any]
    items: list[tuple[float, Item]]  # (fraction of the duration, item), the last final
    duration: float
    flops: float  # FLOPs the whole run trains
    full: bool
    loss: float | None
    state: str = "queued"  # queued | running | ended | cancelled
    start: float = math.nan
    end: float = math.nan  # when its worker frees (a lost run: at the loss)
    next: int = 0  # the next item handed out
    ready: bool = False
    kind: str = "completed"

    def item_time(self, index: int) -> float:
        return self.start + self.items[index][0] * self.duration

    @property
    def rate(self) -> float:
        return self.flops / self.duration if self.duration > 0 else 0.0


@dataclass
class _Clock:
    now: float = 0.0
    stamp: float = field(default_factory=time.perf_counter)


class SimulatedBackend:
    """The `Backend` protocol answered from `landscape` (see the module): `workers`
    simulated workers, each run's duration from the landscape (or `duration_s` per full run),
    the runner's real time × `overhead_scale` added to the clock, every `lose_every`-th
    launched run losing its worker, `cpus_per_worker` CPUs per worker (`largest_node`)."""

    def __init__(
        self,
        landscape: LandscapeRead,
        workers: int = 1,
        duration_s: float | None = None,
        overhead_scale: float = 1.0,
        lose_every: int | None = None,
        cpus_per_worker: int = 64,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be positive, got {workers}")
        if duration_s is not None and not duration_s > 0:
            raise ValueError(f"duration_s: must be positive, got {duration_s}")
        if lose_every is not None and lose_every < 1:
            raise ValueError(f"lose_every: must be positive, got {lose_every}")
        self.landscape = landscape
        self.workers = workers
        self.duration_s = duration_s
        self.overhead_scale = overhead_scale
        self.lose_every = lose_every
        self.cpus_per_worker = cpus_per_worker
        self._recorded = [record(t) for t in landscape.trials if trainable(t)]
        self.reset()

    def reset(self) -> None:
        """A fresh clock at 0 and fresh counters (the landscape stays)."""
        self.clock = _Clock()
        self.events: list[SimEvent] = []
        self.runs_launched = 0
        self.busy_s = 0.0
        self._free = self.workers
        self._queue: deque[_Run] = deque()
        self._ends: list[tuple[float, int, _Run]] = []  # running runs by end
        self._items: list[tuple[float, int, _Run]] = []  # running runs by next item
        self._ready: dict[int, _Run] = {}
        self._running = 0
        self._compute = 0.0  # FLOPs trained up to `_compute_at`
        self._compute_at = 0.0
        self._rate = 0.0  # FLOPs per simulated second of every running run
        self._last_end = 0.0

    # -- the protocol --------------------------------------------------------------------
    def connect(self) -> bool:
        self.clock.stamp = time.perf_counter()
        return False

    def shutdown(self) -> None:
        return None

    def largest_node(self) -> dict[str, float]:
        return {"CPU": float(self.cpus_per_worker), "GPU": 0.0}

    def launch(self, spec: TrainSpec) -> Any:
        self._sync()
        self.runs_launched += 1
        run = self._answer(self.runs_launched, spec)
        if self.lose_every is not None and self.runs_launched % self.lose_every == 0:
            lost = SimulatedWorkerLost(f"simulated worker lost (run {run.number})")
            run.items = [(a, it) for a, it in run.items if a < 0.5] + [(0.5, lost)]
            run.kind, run.loss, run.full = "lost", None, False
        self._queue.append(run)
        self._start_queued(self.clock.now)
        return run

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        self._sync()
        wanted = {id(h) for h in handles}
        while True:
            self._mark_ready()
            ready = [r for key, r in self._ready.items() if key in wanted]
            if ready:
                break
            nxt = self._next_item_time(wanted)
            if self._queue and self._ends:
                nxt = min(nxt, self._ends[0][0])
            if not math.isfinite(nxt):
                break  # nothing of these handles will ever be ready
            self._advance(max(nxt, self.clock.now))
        self.clock.stamp = time.perf_counter()
        return ready

    def next_item(self, handle: Any) -> Item:
        run: _Run = handle
        self._sync()
        if (
            run.state == "queued"
            or run.next >= len(run.items)
            or run.item_time(run.next) > (self.clock.now)
        ):
            return RuntimeError(f"simulated run {run.number} has no item ready")
        item = run.items[run.next][1]
        run.next += 1
        run.ready = False
        self._ready.pop(id(run), None)
        if run.next < len(run.items) and run.state != "cancelled":
            heapq.heappush(self._items, (run.item_time(run.next), run.number, run))
        return item

    def cancel(self, handle: Any) -> None:
        run: _Run = handle
        self._sync()
        now = self.clock.now
        if run.state == "queued":
            self._queue.remove(run)
            run.state = "cancelled"
            self._log(run, now, "cancelled")
        elif run.state == "running":
            self._stop(run, now)
            run.state = "cancelled"
            self._log(run, now, "cancelled")
            self._start_queued(now)
        self._ready.pop(id(run), None)

    def retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, SimulatedWorkerLost)

    # -- counters ------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """The simulated time (seconds since `connect` or `reset`)."""
        return self.clock.now

    @property
    def compute_spent(self) -> float:
        """FLOPs trained so far, the running runs' share included."""
        return self._compute + self._rate * (self.clock.now - self._compute_at)

    @property
    def makespan_s(self) -> float:
        """From 0 to the end of the last run (to now while a run is running)."""
        return self.clock.now if self._running else self._last_end

    @property
    def utilisation(self) -> float:
        """Busy worker-seconds over workers × makespan (running runs count up to now)."""
        span = self.makespan_s
        busy = self.busy_s + sum(self.clock.now - r.start for _, _, r in self._ends if _live(r))
        return busy / (self.workers * span) if span > 0 else 0.0

    def counters(self) -> dict[str, float]:
        return {
            "workers": self.workers,
            "runs_launched": self.runs_launched,
            "busy_s": self.busy_s,
            "makespan_s": self.makespan_s,
            "utilisation": self.utilisation,
            "compute_spent": self.compute_spent,
        }

    # -- the clock -----------------------------------------------------------------------
    def _sync(self) -> None:
        """Add the real time since the last call (× `overhead_scale`) to the clock."""
        stamp = time.perf_counter()
        self._advance(self.clock.now + (stamp - self.clock.stamp) * self.overhead_scale)
        self.clock.stamp = stamp

    def _advance(self, t: float) -> None:
        """Move the clock to `t`: every run ending by then frees its worker, queued runs
        start on it when it frees."""
        while self._ends and self._ends[0][0] <= t:
            end, _, run = heapq.heappop(self._ends)
            if run.state != "running" or run.end != end:
                continue  # cancelled meanwhile (its worker freed then)
            self._stop(run, end)
            run.state = "ended"
            self._log(run, end, run.kind, run.loss)
            self._start_queued(end)
        self.clock.now = max(self.clock.now, t)

    def _start_queued(self, at: float) -> None:
        while self._free and self._queue:
            run = self._queue.popleft()
            self._account(at)
            self._free -= 1
            self._running += 1
            self._rate += run.rate
            run.state, run.start = "running", at
            run.end = run.item_time(len(run.items) - 1)
            heapq.heappush(self._ends, (run.end, run.number, run))
            heapq.heappush(self._items, (run.item_time(0), run.number, run))

    def _stop(self, run: _Run, at: float) -> None:
        """Free `run`'s worker at `at` (its end, a cancel or a loss)."""
        self._account(at)
        self._rate -= run.rate
        self._free += 1
        self._running -= 1
        self.busy_s += at - run.start
        self._last_end = max(self._last_end, at)
        if self._running == 0:
            self._rate = 0.0  # no drift once every run has ended
        run.end = at

    def _account(self, at: float) -> None:
        self._compute += self._rate * (at - self._compute_at)
        self._compute_at = at

    def _next_item_time(self, wanted: set[int]) -> float:
        """The earliest next item among the running runs of `wanted` (inf: none)."""
        while self._items and not _current(self._items[0]):
            heapq.heappop(self._items)
        if not self._items:
            return math.inf
        if id(self._items[0][2]) in wanted:
            return self._items[0][0]
        return min(
            (t for t, _, r in self._items if id(r) in wanted and _current((t, 0, r))),
            default=math.inf,
        )

    def _mark_ready(self) -> None:
        now = self.clock.now
        while self._items and self._items[0][0] <= now:
            _, _, run = heapq.heappop(self._items)
            if run.state == "cancelled" or run.next >= len(run.items):
                continue
            run.ready = True
            self._ready[id(run)] = run

    def _log(self, run: _Run, at: float, kind: str, loss: float | None = None) -> None:
        self._account(at)
        full = run.full and kind == "completed"
        self.events.append(SimEvent(at, self._compute, kind, run.number, run.identity, loss, full))

    # -- answering a run -----------------------------------------------------------------
    def _answer(self, number: int, spec: TrainSpec) -> _Run:
        """The run's items, duration and compute from the nearest recorded point."""
        identity = _identity(spec)
        try:
            rec, setting = nearest_setting(nearest(self._recorded, spec.arch), spec)
        except SimulatedLookupError as exc:
            identity["trial"] = None
            return _Run(number, spec, identity, [(0.0, exc)], 0.0, 0.0, False, None, kind="failed")
        run = (
            setting.runs.get(spec.seed) or setting.runs.get(0) or next(iter(setting.runs.values()))
        )
        identity |= {"trial": rec.trial.number, "recorded_setting": dict(setting.setting)}
        total = spec.planned_steps()
        exact = spec.arch == rec.arch
        fpt = float(training_flops_per_token(spec.arch, causal=True))
        own = curve_of(run.curve, rec.arch)  # a run that kept its own curve: no scaling
        shape = own or rec.curve
        rec_steps = run.steps or shape.steps
        rec_tokens = run.tokens_seen or rec_steps * spec.tokens_per_step
        if exact:
            fraction = total / rec_steps
        else:
            rec_fpt = float(training_flops_per_token(rec.arch, causal=True))
            fraction = total * spec.tokens_per_step * fpt / (rec_tokens * rec_fpt)
        fraction = min(1.0, fraction)
        start = spec.start_step
        stop = total if spec.stop_step is None else spec.stop_step
        branch = max(1, int(spec.decay_frac * stop)) if stop < total else 0
        trained = stop - start + branch
        tokens = trained * spec.tokens_per_step
        if self.duration_s is not None:
            duration = self.duration_s * trained / total
        else:
            duration = (run.wall_time_s or 0.0) * tokens / rec_tokens
        diverged = run.status == "diverged" or run.final_val_loss is None
        final_s = math.nan if run.final_val_loss is None else float(run.final_val_loss)
        same = diverged or own is not None or final_s == shape.final
        scale = 1.0 if same else final_s / shape.final

        def loss_at(x: float) -> float:
            if not diverged and x >= 1.0:
                return final_s
            return interp(x, shape.xs, shape.losses, scale)

        steps = sorted(
            {min(total, max(1, round(p * total))) for p in shape.step_fractions} | {total}
        )
        items: list[tuple[float, Item]] = []
        for s in steps:
            if start < s <= stop and not (diverged and s == total):
                loss = loss_at(fraction * s / total)
                point = EvalPoint(
                    step=s,
                    tokens=s * spec.tokens_per_step,
                    flops=s * spec.tokens_per_step * fpt,
                    val_loss=loss,
                    train_loss=loss,
                    elapsed_s=duration * (s - start) / trained,
                )
                items.append(((s - start) / trained, point))
        final = math.nan if diverged else loss_at(fraction * stop / total)
        curve = [p for _, p in items if isinstance(p, EvalPoint)]
        losses = [p.val_loss for p in curve] + ([] if diverged else [final])
        result = TrainResult(
            status="diverged" if diverged else "completed",
            reason=(run.reason or "diverged")
            if diverged
            else f"simulated: {stop - start} steps from landscape trial {rec.trial.number}",
            final_val_loss=final,
            best_val_loss=min(losses, default=math.nan),
            final_train_loss=final,
            curve=curve,
            steps=stop,
            tokens_seen=tokens,
            flops_spent=tokens * fpt,
            flops_budget=spec.budget_flops,
            wall_time_s=duration,
            eval_time_s=0.0,
            tokens_per_s=tokens / duration if duration > 0 else 0.0,
            peak_memory_bytes=run.peak_memory_bytes or 0,
            memory_kind=run.memory_kind or "simulated",
            device="simulated",
            params=int(rec.trial.metrics.get("params") or 0),
            corpus=dict(run.corpus or {}),
            start_step=start,
            branch_steps=branch,
            checkpoint=spec.checkpoint_out if stop < total else None,
        )
        items.append((1.0, result))
        full = not diverged and stop == total and fraction == 1.0
        end_loss = None if diverged else final
        return _Run(number, spec, identity, items, duration, tokens * fpt, full, end_loss)


def _identity(spec: TrainSpec) -> dict[str, Any]:
    a = spec.arch
    return {
        "variant": a.variant,
        "block_size": a.block_size,
        "n_layers": a.n_layers,
        "d_model": a.d_model,
        "lr": spec.lr,
        "depth_lr_mult": spec.depth_lr_mult,
        "warmup_frac": spec.warmup_frac,
        "weight_decay": spec.weight_decay,
        "seed": spec.seed,
        "budget_flops": spec.budget_flops,
        "budget_tokens": spec.budget_tokens,
        "start_step": spec.start_step,
        "stop_step": spec.stop_step,
    }


def _live(run: _Run) -> bool:
    return run.state == "running"


def _current(entry: tuple[float, int, _Run]) -> bool:
    """Whether a heap entry is its run's next item still to come."""
    t, _, run = entry
    return run.state != "cancelled" and run.next < len(run.items) and run.item_time(run.next) == t
