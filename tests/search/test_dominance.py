"""Pareto dominance (`nas_service.search.dominance`): the scalar and the vectorised forms, on
the cases a wrong definition gets wrong — equal points, trade-offs, NaN — and on each other."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from nas_service.search.dominance import dominance, dominates

NAN = math.nan


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((1.0, 2.0), (1.0, 3.0), True),  # no worse in one, better in the other
        ((1.0, 3.0), (1.0, 2.0), False),
        ((0.0, 0.0), (1.0, 1.0), True),
        ((1.0, 2.0), (1.0, 2.0), False),  # equal points never dominate each other
        ((1.0, 3.0), (2.0, 1.0), False),  # a trade-off: neither dominates
        ((2.0, 1.0), (1.0, 3.0), False),
        ((NAN, 1.0), (2.0, 2.0), False),  # a NaN is not better than anything
        ((1.0, 1.0), (2.0, NAN), False),  # nor worse: ignoring it would say True
        ((NAN, NAN), (NAN, NAN), False),
        ((1.0,), (2.0,), True),
        ((-math.inf, 5.0), (0.0, 5.0), True),
    ],
)
def test_dominates_by_the_definition(
    a: tuple[float, ...], b: tuple[float, ...], expected: bool
) -> None:
    assert dominates(a, b) is expected
    assert bool(dominance([a], [b])[0, 0]) is expected


def test_vectors_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        dominates((1.0, 2.0), (1.0,))


def test_the_matrix_is_every_pair_and_agrees_with_the_scalar_form() -> None:
    rng = random.Random(7)
    values = [0.0, 1.0, 2.0, NAN, math.inf]  # few values: many ties, some NaN
    a = [tuple(rng.choice(values) for _ in range(3)) for _ in range(40)]
    b = [tuple(rng.choice(values) for _ in range(3)) for _ in range(30)]
    matrix = dominance(np.array(a), np.array(b))
    assert matrix.shape == (40, 30) and matrix.dtype == bool
    for (i, x), (j, y) in itertools.product(enumerate(a), enumerate(b)):
        assert matrix[i, j] == dominates(x, y), (x, y)
    assert matrix.any() and not matrix.all()  # the draw holds both kinds of pairs


def test_no_point_dominates_itself_and_dominance_is_antisymmetric() -> None:
    rng = np.random.default_rng(3)
    points = rng.integers(0, 3, size=(50, 2)).astype(float)
    matrix = dominance(points, points)
    assert not matrix.diagonal().any()
    assert not (matrix & matrix.T).any()
