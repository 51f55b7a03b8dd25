"""The pure rules of multi-fidelity search (`nas_service.search.fidelity`): rung steps, Hyperband
brackets by trial number, non-dominated ranks, the promotion order, ASHA's ⌊n/η⌋ and the
bound past which a result can never go on."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from nas_service.search.fidelity import (
    Result,
    Rung,
    bracket_of,
    bracket_rungs,
    bracket_sizes,
    can_never_promote,
    nondominated_rank,
    promotable,
    promotion_count,
    promotion_order,
    rung_steps,
    rungs_of,
    settled_position,
)
from nas_service.spec import parse_spec
from tests.support.hostile import with_


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[float, ...] = (1 / 9, 1 / 3, 1.0)
    reduction: float = 3.0
    brackets: int = 1


def _brute_rank(vectors: Sequence[tuple[float, ...]]) -> list[int]:
    """Peeling fronts by the definition, for comparison."""

    def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    rank, left, r = [-1] * len(vectors), set(range(len(vectors))), 0
    while left:
        front = {i for i in left if not any(dominates(vectors[j], vectors[i]) for j in left)}
        for i in front:
            rank[i] = r
        left -= front
        r += 1
    return rank


# -- rungs ------------------------------------------------------------------------------------
def test_rung_steps_round_and_the_last_rung_is_the_whole_run() -> None:
    assert rung_steps(1 / 9, 90) == 10
    assert rung_steps(1 / 3, 90) == 30
    assert rung_steps(0.25, 10) == 2  # 2.5: half to even
    assert rung_steps(0.001, 10) == 1  # never zero steps
    for total in (1, 7, 97, 10**6 + 3, 2**40 + 1):
        assert rung_steps(1.0, total) == total
        assert rung_steps(0.999999, total) <= total
    with pytest.raises(ValueError, match="total_steps"):
        rung_steps(0.5, 0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        rung_steps(1.5, 10)


def test_rungs_of_a_spec_and_of_a_bracket() -> None:
    spec = parse_spec(
        with_(
            ("fidelity", {"rungs": [0.1, 0.3, 1.0], "brackets": 2}),
            ("training.schedule", "wsd"),
        )
    )
    assert spec.fidelity is not None
    assert rungs_of(spec.fidelity) == [Rung(0, 0.1), Rung(1, 0.3), Rung(2, 1.0)]
    assert bracket_rungs(1, spec.fidelity) == [Rung(1, 0.3), Rung(2, 1.0)]
    assert bracket_of(0, spec.fidelity) == 0
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        bracket_rungs(2, spec.fidelity)


# -- brackets ---------------------------------------------------------------------------------
def test_bracket_sizes_are_hyperband_s() -> None:
    assert bracket_sizes(1, 3) == [1]
    assert bracket_sizes(3, 3) == [9, 5, 3]  # Hyperband's table for R = 9, η = 3
    assert bracket_sizes(5, 3) == [81, 34, 15, 8, 5]  # R = 81
    assert bracket_sizes(2, 2.5) == [3, 2]  # ⌈2/2 · 2.5⌉, ⌈2/1 · 1⌉


def test_asha_puts_every_trial_in_bracket_0() -> None:
    assert {bracket_of(n, Ladder()) for n in range(500)} == {0}


@pytest.mark.parametrize(
    ("brackets", "reduction"), [(2, 3.0), (3, 3.0), (3, 2.0), (4, 2.5), (5, 3.0), (3, 4.0)]
)
def test_every_window_of_one_cycle_holds_hyperband_s_shares(
    brackets: int, reduction: float
) -> None:
    eight = tuple((i + 1) / 8 for i in range(8))
    ladder = Ladder(rungs=eight, reduction=reduction, brackets=brackets)
    sizes = bracket_sizes(brackets, reduction)
    cycle = sum(sizes)
    seq = [bracket_of(n, ladder) for n in range(3 * cycle)]
    assert seq[0] == 0  # a cycle opens with the most aggressive bracket
    for start in range(2 * cycle):  # aligned or not
        assert Counter(seq[start : start + cycle]) == dict(enumerate(sizes))
    # spread, not in runs: bracket 0's share of every prefix is within one of its due
    for p in range(cycle + 1):
        assert abs(seq[:p].count(0) - p * sizes[0] / cycle) < 1
    assert seq[:cycle] == [bracket_of(n, ladder) for n in range(5 * cycle, 6 * cycle)]


def test_bracket_of_is_cheap_for_huge_cycles() -> None:
    ladder = Ladder(rungs=tuple((i + 1) / 8 for i in range(8)), reduction=100.0, brackets=8)
    sizes = bracket_sizes(8, 100.0)
    assert sum(sizes) > 10**14
    counts = Counter(bracket_of(n, ladder) for n in range(2000))
    assert abs(counts[0] - 2000 * sizes[0] / sum(sizes)) < 1
    assert 0 <= bracket_of(10**15 - 1, ladder) < 8
    with pytest.raises(ValueError, match="start at 0"):
        bracket_of(-1, ladder)


# -- ranks ------------------------------------------------------------------------------------
def test_nondominated_rank_with_ties_and_duplicates() -> None:
    vectors = [
        (1.0, 5.0),  # front
        (2.0, 2.0),  # front
        (2.0, 2.0),  # duplicate: shares the rank
        (5.0, 1.0),  # front
        (2.0, 5.0),  # dominated by (1, 5) and (2, 2) → 1
        (3.0, 3.0),  # dominated by (2, 2) → 1
        (3.0, 5.0),  # dominated by (2, 5), (3, 3) → 2
        (1.0, 5.0),  # duplicate of the first
    ]
    assert nondominated_rank(vectors) == [0, 0, 0, 0, 1, 1, 2, 0]
    assert nondominated_rank([]) == []
    assert nondominated_rank([(3.0,), (1.0,), (3.0,), (2.0,)]) == [2, 0, 2, 1]
    assert nondominated_rank([(float("nan"), 0.0), (1.0, 0.0)]) == [1, 0]  # NaN as +inf
    with pytest.raises(ValueError, match="different lengths"):
        nondominated_rank([(1.0,), (1.0, 2.0)])


def test_nondominated_rank_agrees_with_the_definition() -> None:
    rng = random.Random(7)
    for n, m in itertools.product((1, 2, 17, 60), (1, 2, 3)):
        vectors = [tuple(float(rng.randint(0, 4)) for _ in range(m)) for _ in range(n)]
        assert nondominated_rank(vectors) == _brute_rank(vectors), vectors


def test_nondominated_rank_of_many_results_in_blocks() -> None:
    rng = random.Random(3)
    vectors = [(rng.random(), rng.random()) for _ in range(700)]  # more than one block
    assert nondominated_rank(vectors) == _brute_rank(vectors)


# -- promotion --------------------------------------------------------------------------------
def test_promotion_order_is_rank_then_loss_then_number() -> None:
    results = [
        Result(4, loss=3.0, objectives=(3.0, 1.0)),  # front
        Result(1, loss=2.0, objectives=(2.0, 4.0)),  # rank 1 (behind 2)
        Result(2, loss=2.0, objectives=(2.0, 2.0)),  # front
        Result(0, loss=2.0, objectives=(2.0, 2.0)),  # front, same vector: number decides
        Result(3, loss=1.0, objectives=(1.0, 9.0)),  # front
    ]
    assert [r.number for r in promotion_order(results)] == [3, 0, 2, 4, 1]
    one = [Result(n, loss) for n, loss in enumerate([0.5, 0.2, 0.5, float("nan"), 0.1])]
    assert [r.number for r in promotion_order(one)] == [4, 1, 0, 2, 3]
    assert one[0].vector == (0.5,)
    with pytest.raises(ValueError, match="one result per trial"):
        promotion_order([Result(1, 0.1), Result(1, 0.2)])


def test_the_loss_breaks_a_tie_of_rank_when_it_is_not_an_objective() -> None:
    results = [Result(0, 3.0, (10.0,)), Result(1, 2.0, (10.0,)), Result(2, 9.0, (5.0,))]
    assert [r.number for r in promotion_order(results)] == [2, 1, 0]


def test_promotable_is_the_best_n_over_eta_not_yet_promoted() -> None:
    assert [promotion_count(n, 3) for n in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert promotion_count(11, 1.1) == 10  # exact: η as written, not as its float
    assert promotion_count(10, 10 / 3) == 2  # 3.3333333333333335 as written: 10/η < 3
    assert promotion_count(7, 2.5) == 2
    results = [Result(n, loss) for n, loss in enumerate([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8])]
    assert promotable(results[:2], 3, promoted=()) == []
    assert [r.number for r in promotable(results[:3], 3, promoted=())] == [1]
    assert [r.number for r in promotable(results, 3, promoted=())] == [1, 5]
    assert [r.number for r in promotable(results, 3, promoted={1})] == [5]
    assert [r.number for r in promotable(results, 2, promoted={1})] == [5, 3]


def test_a_result_past_the_bound_never_goes_on_whatever_arrives() -> None:
    assert not can_never_promote(2, 9, 3)
    assert can_never_promote(3, 9, 3)
    assert can_never_promote(0, 2, 3)  # a rung of 2 results at η = 3 promotes none
    rng = random.Random(11)
    eta, most, marked = 3.0, 12, 0
    for trial in range(200):
        m = 1 + trial % 3  # one, two and three objectives
        arrivals = [
            Result(n, rng.random(), tuple(float(rng.randint(0, 3)) for _ in range(m)))
            for n in range(most)
        ]
        promoted_at: dict[int, int] = {}
        never_at: dict[int, int] = {}
        for k in range(1, most + 1):  # results arrive one by one
            seen = arrivals[:k]
            for r in promotable(seen, eta, promoted=promoted_at):
                promoted_at[r.number] = k
            for r in seen:
                if can_never_promote(settled_position(r, seen), most, eta):
                    never_at.setdefault(r.number, k)
        # marked at step k: never promoted at k or later (perhaps before: ASHA keeps it)
        assert all(promoted_at[n] < k for n, k in never_at.items() if n in promoted_at)
        marked += sum(1 for n, k in never_at.items() if k < most)
    assert marked > 100  # the bound decides early, not only once the rung is full


def test_with_one_objective_the_settled_position_is_the_position() -> None:
    results = [Result(n, loss) for n, loss in enumerate([0.4, 0.2, 0.4, 0.1, 0.3])]
    order = promotion_order(results)
    assert [settled_position(r, results) for r in order] == list(range(len(results)))


def test_with_several_objectives_a_position_can_improve_but_the_settled_one_holds() -> None:
    """A newcomer dominating two results ahead of r (but not r's dominator) moves r up: the
    position is no bound, only the settled position (what dominates r) is."""
    r, d = Result(0, 1.0, (1.0, 5.0)), Result(1, 1.0, (0.5, 4.0))  # d dominates r
    c1, c2 = Result(2, 2.0, (3.0, 2.0)), Result(3, 2.0, (4.0, 1.5))  # the front, with d
    before = [r, d, c1, c2]
    assert [y.number for y in promotion_order(before)] == [1, 2, 3, 0]
    x = Result(4, 3.0, (2.0, 1.0))  # dominates c1 and c2, neither d nor r
    after = [*before, x]
    assert [y.number for y in promotion_order(after)] == [1, 4, 0, 2, 3]  # r: 3rd → 2nd
    assert settled_position(r, before) == settled_position(r, after) == 1
    assert settled_position(c1, after) == 1  # x stays ahead of c1 for good
