"""The rules of multi-fidelity search, pure (the standard library and numpy): the rungs a
candidate passes, the Hyperband bracket of a trial, and which results at a rung go on (ASHA
with a non-dominated rank). The runner applies them (`JobSpec.fidelity`); nothing here
trains, stores or asks a study.

Rungs. A rung is a fraction of a candidate's budget; `rung_steps` turns it into optimizer
steps of that candidate's run, max(1, round(fraction · total)) (Python's round: half to
even), the last rung (1) exactly the whole run.

Brackets (Hyperband). With K rungs and B brackets (1 ≤ B ≤ K), bracket b's candidates start
at rung b, and of every cycle of C = n_0 + … + n_{B−1} consecutive trial numbers, exactly
n_b = ⌈B/(B−b) · η^(B−1−b)⌉ go to bracket b (Hyperband's share of configurations, η the
reduction): B = 3, η = 3 gives 9, 5 and 3 of every 17. `bracket_of` is a function of the
trial number alone, periodic in C, so every window of C consecutive numbers (aligned or not)
holds exactly those shares, and within a cycle each bracket's trials are spread evenly
rather than in runs: number p (mod C) goes to bracket 0 when ⌈(p+1)·n_0/C⌉ > ⌈p·n_0/C⌉ (so
the first of a cycle does), and the others are split among brackets 1… the same way, by
their index among the numbers bracket 0 did not take. B = 1 is ASHA: every trial in bracket
0.

Promotion (ASHA). At a rung holding n results, the best ⌊n/η⌋ may go on (`promotable`), as
soon as they are among them; a result promoted stays promoted. "Best" is the promotion order
(`promotion_order`), a total order:

1. the non-dominated rank of the result's objective vector among the rung's results (0 =
   the Pareto front; every objective minimised; equal vectors share a rank);
2. then the loss (lower first);
3. then the trial number (lower first: the earlier trial wins an exact tie).

With one objective (val_loss) the vector is the loss, and the order is simply by loss, then
number. NaN counts as +inf (last) in vectors and losses.

Never promoted. Later results at a rung can only add results that stay ahead of a given one:
a result dominated by c is ranked behind c whatever arrives (its rank exceeds c's), and so
is one with c's very vector and a later (loss, number). `settled_position` counts those;
`can_never_promote(position, max_results, η)` is true once that count reaches ⌊max/η⌋, the
most the rung will ever promote. With one objective the settled position is the position in
the promotion order; with several, the position itself is no bound (a new result can
dominate several results ahead of this one and move it up), so pass the settled one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

from nas_service.search.dominance import dominance

#: Dominance is computed in blocks of at most this many (row, column) pairs of results.
_BLOCK_PAIRS = 1 << 18


class Ladder(Protocol):
    """What the rules read of a fidelity section (`nas_service.spec.Fidelity`)."""

    @property
    def rungs(self) -> Sequence[float]: ...

    @property
    def reduction(self) -> float: ...

    @property
    def brackets(self) -> int: ...


@dataclass(frozen=True)
class Rung:
    """Rung `index` (0-based) of a ladder: `fraction` of each candidate's budget."""

    index: int
    fraction: float


@dataclass(frozen=True)
class Result:
    """One trial's result at a rung: its number, its loss (val_loss at the rung) and its
    objective vector (every objective minimised; empty: the loss alone)."""

    number: int
    loss: float
    objectives: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(float(v) for v in self.objectives))

    @property
    def vector(self) -> tuple[float, ...]:
        """The objective vector ranked: `objectives`, or (loss,) when none is given."""
        return self.objectives or (float(self.loss),)


def rungs_of(ladder: Ladder) -> list[Rung]:
    return [Rung(i, float(f)) for i, f in enumerate(ladder.rungs)]


def bracket_rungs(bracket: int, ladder: Ladder) -> list[Rung]:
    """The rungs a candidate of `bracket` passes: rung `bracket` to the last."""
    if not 0 <= bracket < ladder.brackets:
        raise ValueError(f"bracket {bracket} is outside 0..{ladder.brackets - 1}")
    return rungs_of(ladder)[bracket:]


def rung_steps(fraction: float, total_steps: int) -> int:
    """The optimizer steps of a rung of `fraction` in a run of `total_steps`:
    max(1, round(fraction · total)), the full rung (1) exactly `total_steps`."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {total_steps}")
    if not 0 < fraction <= 1:
        raise ValueError(f"a rung's fraction lies in (0, 1], got {fraction}")
    if fraction == 1:
        return total_steps
    return max(1, round(fraction * total_steps))


def _exact(reduction: float) -> Fraction:
    """η as the decimal it is written as (the shortest text of its float: 1.1 is 11/10), so
    that ⌊11/1.1⌋ is 10 and no rounding of the float decides a count."""
    return Fraction(repr(float(reduction)))


def bracket_sizes(brackets: int, reduction: float) -> list[int]:
    """Hyperband's trials per cycle of each bracket: n_b = ⌈B/(B−b) · η^(B−1−b)⌉ (computed
    exactly, `_exact`)."""
    if brackets < 1:
        raise ValueError(f"brackets must be at least 1, got {brackets}")
    if not reduction > 1:
        raise ValueError(f"the reduction must be above 1, got {reduction}")
    eta = _exact(reduction)
    return [
        math.ceil(Fraction(brackets, brackets - b) * eta ** (brackets - 1 - b))
        for b in range(brackets)
    ]


def bracket_of(trial_number: int, ladder: Ladder) -> int:
    """The bracket of trial `trial_number` (0-based): see the module's docstring."""
    if trial_number < 0:
        raise ValueError(f"trial numbers start at 0, got {trial_number}")
    sizes = bracket_sizes(ladder.brackets, ladder.reduction)
    remaining = sum(sizes)
    p = trial_number % remaining
    for b, n in enumerate(sizes[:-1]):
        through = -(-(p + 1) * n // remaining)  # ⌈(p+1)·n/N⌉: bracket b's among 0..p
        if through > -(-p * n // remaining):
            return b
        p -= through  # the index among the numbers bracket b did not take
        remaining -= n
    return len(sizes) - 1


def _matrix(vectors: Sequence[Sequence[float]]) -> np.ndarray:
    lengths = {len(v) for v in vectors}
    if len(lengths) > 1:
        raise ValueError(f"objective vectors of different lengths: {sorted(lengths)}")
    v = np.asarray(vectors, dtype=float).reshape(len(vectors), -1)
    if v.shape[1] == 0:
        raise ValueError("an objective vector needs at least one value")
    return np.where(np.isnan(v), np.inf, v)


def _dominators(v: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """How many of `rows` dominate each result (no worse everywhere, better somewhere)."""
    counts = np.zeros(len(v), dtype=np.int64)
    step = max(1, _BLOCK_PAIRS // len(v))
    for start in range(0, len(rows), step):
        counts += dominance(v[rows[start : start + step]], v).sum(axis=0)  # (rows, n) summed
    return counts


def nondominated_rank(vectors: Sequence[Sequence[float]]) -> list[int]:
    """The non-dominated rank of each vector (every objective minimised, NaN as +inf):
    0 for the Pareto front, 1 for the front of what remains without it, and so on. Equal
    vectors never dominate each other, so they share a rank."""
    if len(vectors) == 0:
        return []
    v = _matrix(vectors)
    if v.shape[1] == 1:  # the fronts are the distinct values, in order
        _, inverse = np.unique(v[:, 0], return_inverse=True)
        return [int(r) for r in inverse.reshape(-1)]
    counts = _dominators(v, np.arange(len(v)))
    rank = np.full(len(v), -1, dtype=np.int64)
    front, r = np.flatnonzero(counts == 0), 0
    while front.size:
        rank[front] = r
        counts -= _dominators(v, front)
        front, r = np.flatnonzero((counts == 0) & (rank < 0)), r + 1
    return [int(x) for x in rank]


def _loss_key(loss: float) -> float:
    return math.inf if math.isnan(loss) else float(loss)


def _distinct(results: Sequence[Result]) -> None:
    numbers = [r.number for r in results]
    if len(set(numbers)) != len(numbers):
        raise ValueError("a rung holds at most one result per trial")


def promotion_order(results: Sequence[Result]) -> list[Result]:
    """`results` best first: by non-dominated rank, then loss, then trial number."""
    _distinct(results)
    ranks = nondominated_rank([r.vector for r in results])
    keyed = sorted(
        zip(ranks, results, strict=True), key=lambda t: (t[0], _loss_key(t[1].loss), t[1].number)
    )
    return [r for _, r in keyed]


def promotion_count(n: int, reduction: float) -> int:
    """⌊n/η⌋, exactly: how many of a rung's n results go on."""
    if n < 0:
        raise ValueError(f"a count of results is not negative, got {n}")
    if not reduction > 1:
        raise ValueError(f"the reduction must be above 1, got {reduction}")
    return math.floor(n / _exact(reduction))


def promotable(
    results: Sequence[Result], reduction: float, promoted: Collection[int]
) -> list[Result]:
    """The results at a rung that may go on now, best first: the first ⌊n/η⌋ of the n
    `results` in the promotion order, except the trials already `promoted` (numbers)."""
    best = promotion_order(results)[: promotion_count(len(results), reduction)]
    return [r for r in best if r.number not in promoted]


def settled_position(result: Result, results: Sequence[Result]) -> int:
    """How many of `results` stay ahead of `result` in the promotion order whatever arrives
    later: those whose vector dominates its vector, and those with its very vector and a
    lower (loss, number). With one objective, its position in the promotion order."""
    _distinct(results)
    others = [r for r in results if r.number != result.number]
    if not others:
        return 0
    v = _matrix([result.vector] + [r.vector for r in others])
    mine, theirs = v[0], v[1:]
    dominating = dominance(theirs, mine[None, :])[:, 0]
    equal = np.all(theirs == mine, axis=1)
    key = (_loss_key(result.loss), result.number)
    earlier = np.array([(_loss_key(r.loss), r.number) < key for r in others])
    return int(np.count_nonzero(dominating | (equal & earlier)))


def can_never_promote(position: int, max_results: int, reduction: float) -> bool:
    """Whether a result at settled `position` (0-based; `settled_position`) of a rung that
    will hold at most `max_results` results can never go on: position ≥ ⌊max_results/η⌋."""
    if position < 0:
        raise ValueError(f"a position is not negative, got {position}")
    return position >= promotion_count(max_results, reduction)
