"""A trial's rungs in a multi-fidelity job (`JobSpec.fidelity`): the run of each rung, the
record a trial keeps of each rung it trained, and the trials waiting for promotion. The
rules themselves (brackets, promotion order, ⌊n/η⌋) are `nas_service.search.fidelity`'s; the
successive-halving scheduler (`nas_service.search.scheduler`) applies them for the runner.

A trial of bracket b trains rung b, then waits: its record of the rung (`TrialAttr.RUNGS`) holds
the rung's loss (the best setting's mean over seeds, as a finished trial's) and its
objective vector; `TrialAttr.WAITING` names the rung it waits at. The runner promotes it when it
is among the best ⌊n/η⌋ of the n results at that rung of its bracket (ASHA), trains the next
rung, and so on to the last rung, where the trial is told as any other. A trial that can
never be promoted, or is left waiting when the job has nothing else to do, is told pruned at
its rung.

Fixed compute. Under `reuse: checkpoint` (WSD schedule) rung r of a run of T steps is the
main line from the previous rung's step to `rung_stops(...)[r]`, resumed from the previous
rung's checkpoint, then a short decay branch for the evaluation (`workers.train`); the last
rung ends the main line at T with the schedule's own decay, so a candidate promoted through
every rung ends with exactly the training it would have had straight through, plus the
branches. Under `reuse: retrain` rung r is a complete run at fraction f_r of the budget, from
scratch, its own schedule included: every promotion retrains, and the compute counts it.

Checkpoints live in the operator's artifact store (`Settings.artifact_store`) under
`<job>/<trial>/s<setting>-k<seed>/rung<r>`; a trial's are deleted once it is told, and a
rung's once the next rung has written its own.

Everything the runner needs to go on after a crash is in the trial's attributes (and the
store): recovery puts a trial lost in the middle of a rung back to waiting at the last rung
it finished (`resume_lost`), and the promotion rule, applied again, promotes it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas_service.search.fidelity import (
    Result,
    bracket_of,
    bracket_sizes,
    can_never_promote,
    promotable,
    promotion_count,
    promotion_order,
    rung_steps,
    settled_position,
)
from nas_service.spec import Fidelity
from nas_service.store.records import RungRecord, TrialAttr, rung_records
from workers.contract import TrainSpec


def describe_fidelity(fidelity: Fidelity) -> str:
    """The job's rungs in words (its start event says so): the fractions, η, the brackets,
    and how a promotion reuses the work before it."""
    rungs = ", ".join(f"{float(f):.0%}" for f in fidelity.rungs)
    text = f"rungs at {rungs} of each budget, the best 1/{float(fidelity.reduction):g} go on"
    if fidelity.brackets > 1:
        text += f", {fidelity.brackets} Hyperband brackets"
    if fidelity.reuse == "retrain":
        return text + "; each promotion retrains from scratch (its compute is counted)"
    return text + (
        "; a promotion resumes the stable phase from its rung's checkpoint (exact under WSD), "
        "each rung scored on a decay branch"
    )


def rung_stops(fractions: list[float], first: int, total: int) -> list[int]:
    """The main-line step each rung from `first` on ends at, for a run of `total` steps:
    `rung_steps` of each fraction, made strictly increasing where rounding makes two equal: a
    rung trains at least one step more than the one before, and leaves at least one step to
    each rung after it, so the last ends at `total`. A run of fewer steps than the rungs it
    passes has no such stops: ValueError (`spec.check_job` refuses such a job)."""
    wanted = fractions[first:]
    n = len(wanted)
    if total < n:
        raise ValueError(
            f"a run of {total} steps cannot end {n} rungs at steps of their own "
            "(a rung trains at least one step)"
        )
    stops: list[int] = []
    for i, f in enumerate(wanted):
        low = stops[-1] + 1 if stops else 1
        high = total - (n - 1 - i)  # a step left to each later rung
        stops.append(min(high, max(rung_steps(f, total), low)))
    return stops


def checkpoint_key(job_id: str, number: int, setting: int, seed: int, rung: int) -> str:
    return f"{trial_prefix(job_id, number)}/s{setting}-k{seed}/rung{rung}"


def trial_prefix(job_id: str, number: int) -> str:
    return f"{job_id}/{number}"


def rung_spec(
    base: TrainSpec,
    fidelity: Fidelity,
    rung: int,
    first: int,
    key: Any,
    store: str,
    max_checkpoint_bytes: int = 1 << 30,
) -> TrainSpec:
    """The run of rung `rung` (a trial that started at rung `first`) of the candidate's
    `base` run (its setting and seed applied); `key(rung)` names a checkpoint of this run."""
    fractions = [float(f) for f in fidelity.rungs]
    if fidelity.reuse == "retrain":
        f = fractions[rung]
        if f == 1:
            return base
        if base.budget_flops is not None:
            return base.replace(budget_flops=base.budget_flops * f)
        assert base.budget_tokens is not None
        return base.replace(budget_tokens=max(1, int(base.budget_tokens * f)))
    total = base.planned_steps()
    stops = rung_stops(fractions, first, total)
    stop = stops[rung - first]
    start = 0 if rung == first else stops[rung - first - 1]
    return base.replace(
        start_step=start,
        stop_step=None if stop >= total else stop,
        checkpoint_in=key(rung - 1) if start > 0 else None,
        checkpoint_out=key(rung) if stop < total else None,
        artifact_store=store,
        max_checkpoint_bytes=max_checkpoint_bytes,
    )


@dataclass(frozen=True)
class Waiting:
    """A trial waiting at `rung` (its bracket starts at `first`), with its result there."""

    trial: FrozenTrial
    rung: int
    first: int
    result: Result


def records(trial: FrozenTrial) -> list[RungRecord]:
    return rung_records(trial.user_attrs.get(TrialAttr.RUNGS))


def _result(trial: FrozenTrial, record: RungRecord) -> Result:
    loss = record.get("loss")
    values = record.get("values") or []
    return Result(
        trial.number,
        float(loss) if isinstance(loss, int | float) else float("nan"),
        tuple(float(v) if isinstance(v, int | float) else float("nan") for v in values),
    )


@dataclass
class Ladder:
    """The state of a job's rungs, read from its trials: per (bracket, rung) every result
    and the trials promoted from it, and the trials waiting now (`in_flight`: trial numbers
    the runner trains at the moment, never waiting); `reduction` is η."""

    results: dict[tuple[int, int], list[Result]]
    promoted: dict[tuple[int, int], set[int]]
    waiting: list[Waiting]
    reduction: float

    @classmethod
    def of(cls, fidelity: Fidelity, trials: list[FrozenTrial], in_flight: set[int]) -> Ladder:
        results: dict[tuple[int, int], list[Result]] = {}
        promoted: dict[tuple[int, int], set[int]] = {}
        waiting: list[Waiting] = []
        for t in trials:
            recs = records(t)
            if not recs:
                continue
            first = int(recs[0].get("rung", 0))
            for rec in recs:
                where = (first, int(rec.get("rung", 0)))
                results.setdefault(where, []).append(_result(t, rec))
                if rec.get("promoted"):
                    promoted.setdefault(where, set()).add(t.number)
            at = t.user_attrs.get(TrialAttr.WAITING)
            if t.state == TrialState.RUNNING and isinstance(at, int) and t.number not in in_flight:
                last = recs[-1]
                if int(last.get("rung", -1)) == at and not last.get("promoted"):
                    waiting.append(Waiting(t, at, first, _result(t, last)))
        return cls(results, promoted, waiting, float(fidelity.reduction))

    def promote(self, w: Waiting) -> None:
        """Record that `w` goes on (it no longer waits)."""
        self.promoted.setdefault((w.first, w.rung), set()).add(w.trial.number)
        self.waiting.remove(w)

    def next_promotion(self, top: int) -> Waiting | None:
        """The waiting trial to promote now, if any: the highest rung first (ASHA), below
        the last rung `top`; at a rung, the first promotable in the promotion order."""
        by_place = {(w.first, w.rung, w.trial.number): w for w in self.waiting}
        for rung in range(top - 1, -1, -1):
            for (first, r), results in sorted(self.results.items()):
                if r != rung:
                    continue
                for res in promotable(results, self.reduction, self.promoted.get((first, r), ())):
                    w = by_place.get((first, r, res.number))
                    if w is not None:
                        return w
        return None

    def hopeless(self, n_trials: int) -> list[tuple[Waiting, str]]:
        """The waiting trials that can never be promoted, with the reason: at rung r of a
        bracket starting at rung b, at most M_b = n_trials results, and M_{r+1} = ⌊M_r/η⌋
        (no more can be promoted), so a result whose settled position is ⌊M_r/η⌋ or later
        never goes on."""
        out = []
        for w in self.waiting:
            most = n_trials
            for _ in range(w.first, w.rung):
                most = promotion_count(most, self.reduction)
            results = self.results.get((w.first, w.rung), [])
            position = settled_position(w.result, results)
            if can_never_promote(position, most, self.reduction):
                out.append((w, _not_promoted(w, results, self.reduction)))
        return out


def _not_promoted(w: Waiting, results: list[Result], reduction: float) -> str:
    order = [r.number for r in promotion_order(results)]
    place = order.index(w.trial.number) + 1 if w.trial.number in order else len(order)
    return (
        f"stopped at rung {w.rung + 1} (loss {w.result.loss:.4f}, {place} of {len(results)} "
        f"there): not among the best 1/{reduction:g} that go on"
    )


def leftover_reason(w: Waiting, state: Ladder) -> str:
    """Why a trial still waiting when the job has nothing else to do is told pruned."""
    return _not_promoted(w, state.results.get((w.first, w.rung), []), state.reduction)


def expected_compute(fidelity: Fidelity) -> float:
    """The mean compute of one candidate in units of its straight run, if every rung promotes
    exactly its 1/η: over Hyperband's bracket shares (`fidelity.bracket_sizes`), a candidate
    of bracket b reaches rung k ≥ b with probability η^−(k−b) and then trains the rung's
    share: f_k − f_(k−1) of the main line resumed from a checkpoint (f_(b−1) = 0), or f_k
    from scratch under `reuse: retrain`. The decay branches (a few percent) are not
    counted."""
    fractions = [float(f) for f in fidelity.rungs]
    eta = float(fidelity.reduction)
    sizes = bracket_sizes(fidelity.brackets, eta)
    total = 0.0
    for b, size in enumerate(sizes):
        cost, before = 0.0, 0.0
        for k in range(b, len(fractions)):
            share = fractions[k] if fidelity.reuse == "retrain" else fractions[k] - before
            cost += share * eta ** -(k - b)
            before = fractions[k]
        total += size * cost
    return total / sum(sizes)


def rung_progress(fidelity: Fidelity, rows: list[Any]) -> list[dict[str, Any]]:
    """Per rung of a fidelity job: the trials with a result there (`reached`), training it
    now, waiting there for promotion, and promoted from it. `rows`: the job's
    `results.TrialRow`s (not lost)."""
    out = []
    for k, f in enumerate(fidelity.rungs):
        reached = promoted = waiting = training = 0
        for r in rows:
            recs = [x for x in r.rungs if x.get("rung") == k]
            reached += bool(recs)
            promoted += any(x.get("promoted") for x in recs)
            if str(r.state) != "running":
                continue
            if r.waiting == k:
                waiting += 1
            elif r.waiting is None:
                last = max((int(x.get("rung", -1)) for x in r.rungs), default=None)
                now = last + 1 if last is not None else bracket_of(r.number, fidelity)
                training += now == k
        out.append(
            {
                "rung": k,
                "fraction": float(f),
                "reached": reached,
                "training": training,
                "waiting": waiting,
                "promoted": promoted,
            }
        )
    return out
