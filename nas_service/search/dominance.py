"""Pareto dominance, every objective minimised: `a` dominates `b` when it is no worse in every
objective and better in at least one. Equal vectors do not dominate each other, and a NaN
compares as neither better nor worse, so a vector holding one neither dominates nor is
dominated through that objective (callers that rank NaN as the worst value map it to +inf
first). The scalar form (`dominates`) and the vectorised one (`dominance`, every pair of two
sets of vectors at once) say the same."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether `a` dominates `b` (vectors of the same length)."""
    pairs = list(zip(a, b, strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def dominance(
    a: np.ndarray | Sequence[Sequence[float]], b: np.ndarray | Sequence[Sequence[float]]
) -> np.ndarray:
    """A (len(a), len(b)) boolean matrix: entry (i, j) is whether `a[i]` dominates `b[j]`
    (rows of m objectives each; memory grows as len(a)·len(b)·m, so callers over large sets
    pass blocks of `a`)."""
    x = np.asarray(a, dtype=float)[:, None, :]
    y = np.asarray(b, dtype=float)[None, :, :]
    result: np.ndarray = np.all(x <= y, axis=2) & np.any(x < y, axis=2)
    return result
