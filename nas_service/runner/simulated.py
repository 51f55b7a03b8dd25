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

from cost_model import ArchConfig
from cost_model.flops import training_flops_per_token
from cost_model.residuals import DEPTH_MIXED
from nas_service.store.records import LandscapeRead, TrainRunRead, TrialRead
from workers.contract import EvalPoint, TrainResult, TrainSpec

Item = EvalPoint | TrainResult | BaseException


class SimulatedWorkerLost(RuntimeError):
    """A simulated worker died under its run (fault injection): the runner retries it."""


class SimulatedLookupError(ValueError):
    """The landscape records nothing a run could be answered from (the run fails)."""


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
class _Setting:
    setting: dict[str, float]
    runs: dict[int, TrainRunRead]  # by seed


@dataclass
class _Curve:
    """An evaluation curve: L at token fractions x of its run (0 first, at ln vocab), the
    evaluations' steps as fractions of the run's steps."""

    xs: list[float]
    losses: list[float]
    step_fractions: list[float]
    steps: int

    @property
    def final(self) -> float:
        return self.losses[-1]


@dataclass
class _Recorded:
    """A recorded trial, ready to answer runs."""

    trial: TrialRead
    arch: ArchConfig
    settings: list[_Setting]
    curve: _Curve  # the chosen setting's seed-0 curve


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
        self._recorded = [_record(t) for t in landscape.trials if _trainable(t)]
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
            rec, setting = _nearest_setting(self._nearest(spec.arch), spec)
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
        own = _curve(run.curve, rec.arch)  # a run that kept its own curve: no scaling
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
            return _interp(x, shape.xs, shape.losses, scale)

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

    def _nearest(self, arch: ArchConfig) -> list[_Recorded]:
        """The recorded trials of the nearest architecture (several when a joint training
        axis made one trial per setting)."""
        same = [
            r
            for r in self._recorded
            if r.arch.variant == arch.variant and r.arch.block_size == arch.block_size
        ]
        if not same:
            block = f" with block size {arch.block_size}" if arch.block_size else ""
            raise SimulatedLookupError(f"the landscape records no trial of {arch.variant}{block}")

        def distance(r: _Recorded) -> float:
            return abs(math.log(arch.n_layers / r.arch.n_layers)) + abs(
                math.log(arch.d_model / r.arch.d_model)
            )

        nearest = min(same, key=distance).arch
        return [r for r in same if r.arch == nearest]


def _trainable(trial: TrialRead) -> bool:
    return (
        bool(trial.arch) and bool(trial.train) and _curve(trial.curve, _arch_of(trial)) is not None
    )


def _arch_of(trial: TrialRead) -> ArchConfig:
    return ArchConfig(**trial.arch)  # type: ignore[arg-type]


def _record(trial: TrialRead) -> _Recorded:
    arch = _arch_of(trial)
    chosen = dict(trial.setting)
    groups: dict[tuple[tuple[str, float], ...], _Setting] = {}
    for run in trial.train:
        setting = dict(run.setting or chosen)
        key = tuple(sorted(setting.items()))
        groups.setdefault(key, _Setting(setting, {})).runs.setdefault(run.seed or 0, run)
    curve = _curve(trial.curve, arch)
    assert curve is not None  # `_trainable`
    return _Recorded(trial=trial, arch=arch, settings=list(groups.values()), curve=curve)


def _curve(rows: list[list[float | None]] | None, arch: ArchConfig) -> _Curve | None:
    """A recorded curve's rows [step, tokens, flops, val_loss] (None: none kept)."""
    points = [
        (float(r[0]), float(r[1]), float(r[3]))
        for r in rows or []
        if r[0] is not None and r[1] is not None and r[3] is not None
    ]
    if not points or points[-1][1] <= 0:
        return None
    last_step, last_tokens = points[-1][0], points[-1][1]
    return _Curve(
        xs=[0.0] + [tokens / last_tokens for _, tokens, _ in points],
        losses=[math.log(arch.vocab_size)] + [loss for _, _, loss in points],
        step_fractions=[step / last_step for step, _, _ in points],
        steps=int(last_step),
    )


def _nearest_setting(recs: list[_Recorded], spec: TrainSpec) -> tuple[_Recorded, _Setting]:
    """The recorded setting nearest to the run's, among every setting of `recs` (one
    architecture), and the trial that recorded it."""
    pool = [(r, s) for r in recs for s in r.settings]
    exact = [
        (r, s)
        for r, s in pool
        if s.setting.get("warmup_frac") == spec.warmup_frac
        and s.setting.get("weight_decay") == spec.weight_decay
    ]
    pool = exact or pool
    if not pool:
        raise SimulatedLookupError(f"landscape trial {recs[0].trial.number} records no run")
    mixed = spec.arch.variant in DEPTH_MIXED

    def distance(pair: tuple[_Recorded, _Setting]) -> float:
        setting = pair[1].setting
        d = abs(_log(spec.lr) - _log(setting.get("lr", spec.lr)))
        if mixed:
            d += abs(_log(spec.depth_lr_mult) - _log(setting.get("depth_lr_mult", 1.0)))
        return d

    return min(pool, key=distance)


def _log(x: float) -> float:
    return math.log(max(x, 1e-12))  # depth_lr_mult 0 (frozen mixing) is far from any other


def _interp(x: float, xs: list[float], ys: list[float], scale: float) -> float:
    """The curve at token fraction `x`, linear between its points; the recorded points (not
    the ln(vocab) start) scaled by `scale`."""
    x = min(max(x, 0.0), xs[-1])
    for i in range(1, len(xs)):
        if x <= xs[i]:
            y0 = ys[i - 1] * (scale if i > 1 else 1.0)
            y1 = ys[i] * scale
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
            return y0 + w * (y1 - y0)
    return ys[-1] * scale


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
