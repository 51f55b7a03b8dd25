"""Budgets: tokens under a FLOPs budget, width for a parameter target, the shape grid."""

from __future__ import annotations

import pytest

from cost_model import (
    ArchConfig,
    CostInputError,
    flops_for_tokens,
    param_count,
    shape_grid,
    tokens_for_budget,
    training_flops_per_token,
    width_for_params,
)

TEMPLATE = ArchConfig(n_layers=8, d_model=256, n_heads=4, variant="block_attnres", block_size=4)


def test_tokens_for_budget_spends_at_most_the_budget() -> None:
    budget = 3e13
    tokens = tokens_for_budget(TEMPLATE, budget)
    per_token = training_flops_per_token(TEMPLATE, causal=True)
    assert tokens * per_token <= budget < (tokens + 1) * per_token
    assert flops_for_tokens(TEMPLATE, tokens) <= budget
    with pytest.raises(CostInputError, match="flops_budget"):
        tokens_for_budget(TEMPLATE, 0)


@pytest.mark.parametrize("depth", [4, 8, 16, 32])
def test_width_for_params_is_the_closest_multiple(depth: int) -> None:
    target = 5e6
    cfg = width_for_params(TEMPLATE, depth, target)
    assert cfg.n_layers == depth and cfg.head_dim == TEMPLATE.head_dim
    got = param_count(cfg).total
    for other in (cfg.d_model - 64, cfg.d_model + 64):
        if other <= 0:
            continue
        alt = cfg.replace(d_model=other, n_heads=other // 64)
        assert abs(param_count(alt).total - target) >= abs(got - target)


def test_width_for_params_validates() -> None:
    with pytest.raises(CostInputError, match="target_params"):
        width_for_params(TEMPLATE, 4, -1)
    with pytest.raises(CostInputError, match="block_size"):
        width_for_params(TEMPLATE.replace(block_size=8), 2, 1e6)


def test_shape_grid_fixed_compute_and_params() -> None:
    base = TEMPLATE.replace(variant="baseline", block_size=None)
    points = shape_grid(base, flops_budget=1e15, target_params=2e7, depths=[2, 4, 8, 16, 32])
    # at 32 blocks the nearest multiple of head_dim = 64 misses 2e7 by more than 10%
    assert [p.config.n_layers for p in points] == [2, 4, 8, 16]
    finer = shape_grid(base, 1e15, 2e7, depths=[32, 16, 2, 4, 8], head_dim=16)
    assert [p.config.n_layers for p in finer] == [2, 4, 8, 16, 32]
    points = finer
    ratios = [p.aspect_ratio for p in points]
    assert ratios == sorted(ratios, reverse=True)  # deeper → narrower
    for p in points:
        assert p.params_error <= 0.1
        assert p.tokens == tokens_for_budget(p.config, 1e15)
        assert flops_for_tokens(p.config, p.tokens) <= 1e15
    with pytest.raises(CostInputError, match="depths"):
        shape_grid(base, 1e15, 2e7, depths=[])
