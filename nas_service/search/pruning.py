"""The default pruner of a single-objective job (`pruner: auto`): the median rule at equal
fractions of the budget, with a warm-up and a minimum number of peers.

At fixed compute (a FLOPs budget) the candidates train different numbers of steps: a deep
model takes fewer, larger steps than a shallow one. Optuna's `MedianPruner` compares a trial
with the completed trials that reported at the same *step*, so a trial meets only the runs
of its own architecture (the rest report at other steps), and from its first evaluation on,
when the learning-rate schedule has barely started: early in its budget, the eventual best
is often not ahead of its own architecture's other runs.

`FractionMedianPruner` compares where runs are comparable — at the same share of their own
budget (the same point of every learning-rate schedule, warm-up, stable phase or decay):

- the runner reports each evaluation at `fraction_step(tokens, budget_tokens)`, the fraction
  of the trial's planned tokens in millionths (`FRACTION_SCALE`), not at its optimizer step;
- a trial is judged at its latest fraction f, and only from `warmup` on (default
  `WARMUP`, a third of the budget: the early losses reward fast starters, and a
  learning-rate warm-up makes them noisier still);
- its peers are the *completed* trials of the same `budget` (a trial of another budget is at
  another point of its curve at the same fraction), each read at f by linear interpolation
  between its two evaluations around f (a peer without evaluations on both sides of f is
  not a peer there);
- with fewer than `min_peers` peers (default `MIN_PEERS`) nothing is decided;
- the trial is pruned when its loss at f is above the median m of the peers' losses at f by
  more than `margin` (default `MARGIN`): loss > m · (1 + margin) (a non-finite loss counts as
  +∞, above any median). The peers are the survivors of the search so far, and a sampler
  that has found the good region (TPE) fills the median with the best candidates: without
  the margin the eventual best, tied with them short of its decay phase, was pruned 0.03%
  and 0.1% above their median in 2 of 20 TPE seeds on the WSD landscape. A clear loser is
  far above: there, a third of the way in, the upper quartile of the recorded runs is 4%
  above their median. Losses are cross-entropies, positive, so the margin is a share.

`pruner: median` keeps Optuna's `MedianPruner` at raw steps (2 startup trials, no warm-up)
for jobs where it is right (every candidate trains the same
number of steps: a token budget and one batch size) and as the naive peer of the benchmark.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas_service.search.numbers import finite_or_inf

#: Intermediate values of an `auto`-pruned job are keyed by the fraction of the trial's
#: budget in millionths (Optuna's steps are integers).
FRACTION_SCALE = 1_000_000
#: No decision before this fraction of the budget.
WARMUP = 1 / 3
#: No decision with fewer completed peers than this at the fraction.
MIN_PEERS = 5
#: Pruned only above the peers' median by more than this share of it.
MARGIN = 0.01


def fraction_step(tokens: float, budget_tokens: float) -> int:
    """The step an evaluation after `tokens` of a run of `budget_tokens` is reported at: its
    fraction of the budget in millionths, at most `FRACTION_SCALE`."""
    if budget_tokens <= 0:
        raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
    return min(FRACTION_SCALE, max(0, round(FRACTION_SCALE * tokens / budget_tokens)))


def value_at(values: dict[int, float], step: int) -> float | None:
    """A curve's value at `step` (a fraction step) by linear interpolation between the two
    reported steps around it; None when `step` is outside its reported steps. A non-finite
    value counts as +∞."""
    if not values:
        return None
    steps = sorted(values)
    if step < steps[0] or step > steps[-1]:
        return None
    i = bisect.bisect_left(steps, step)
    if steps[i] == step:
        return finite_or_inf(values[step])
    lo, hi = steps[i - 1], steps[i]
    a, b = finite_or_inf(values[lo]), finite_or_inf(values[hi])
    if math.isinf(a) or math.isinf(b):
        return math.inf
    return a + (b - a) * (step - lo) / (hi - lo)


@dataclass(frozen=True)
class Verdict:
    """Why a trial is pruned: its loss at `fraction` of its budget, and the median of its
    `peers` completed peers there, which it exceeds by more than `margin`."""

    fraction: float
    value: float
    median: float
    peers: int
    margin: float = 0.0

    def reason(self) -> str:
        return (
            f"val_loss {self.value:.4f} at {self.fraction:.0%} of the budget is more than "
            f"{self.margin:.1%} above the median {self.median:.4f} of {self.peers} completed "
            "trials there (budget-fraction median rule)"
        )


class FractionMedianPruner(optuna.pruners.BasePruner):
    """The median rule at equal fractions of the budget (see the module). `last` holds the
    verdict of the last `prune` that answered True (the reason the runner records)."""

    def __init__(
        self, warmup: float = WARMUP, min_peers: int = MIN_PEERS, margin: float = MARGIN
    ) -> None:
        if not 0 <= warmup <= 1:
            raise ValueError(f"warmup is a fraction of the budget in [0, 1], got {warmup}")
        if min_peers < 1:
            raise ValueError(f"min_peers must be at least 1, got {min_peers}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin is a share of the median in [0, 1), got {margin}")
        self.warmup = warmup
        self.min_peers = min_peers
        self.margin = margin
        self.last: Verdict | None = None

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        verdict = self.judge(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), trial)
        if verdict is not None:
            self.last = verdict
        return verdict is not None

    def judge(self, completed: list[FrozenTrial], trial: FrozenTrial) -> Verdict | None:
        """The verdict on `trial` at its latest reported fraction against the `completed`
        trials, or None to let it go on."""
        step = trial.last_step
        if step is None or step < self.warmup * FRACTION_SCALE:
            return None
        value = finite_or_inf(trial.intermediate_values[step])
        budget = trial.params.get("budget")
        at = [
            v
            for t in completed
            if t.number != trial.number and t.params.get("budget") == budget
            if (v := value_at(t.intermediate_values, step)) is not None
        ]
        if len(at) < self.min_peers:
            return None
        median = statistics.median(at)
        if value > median * (1 + self.margin):
            return Verdict(step / FRACTION_SCALE, value, median, len(at), self.margin)
        return None
