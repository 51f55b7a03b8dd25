"""The report's FLOPs metrics say which FLOPs they are, and a report refuses a training
sequence its learned positions cannot cover, naming `seq_len`."""

from __future__ import annotations

import pytest

from cost_model import ArchConfig, CostInputError, Workload, price, price_grid
from cost_model.flops import training_flops_per_token

ARCH = ArchConfig(
    vocab_size=512, seq_len=128, n_layers=4, d_model=128, n_heads=4, positions="learned"
)


def test_model_flops_are_the_budgets_and_hardware_flops_add_recomputation() -> None:
    plain = price(ARCH, Workload(recompute="none")).metrics()
    full = price(ARCH, Workload(recompute="full")).metrics()
    selective = price(ARCH, Workload(recompute="selective")).metrics()
    assert plain["train_flops_per_token"] == full["train_flops_per_token"]
    assert plain["train_hardware_flops_per_token"] == plain["train_flops_per_token"]
    assert full["train_hardware_flops_per_token"] == training_flops_per_token(
        ARCH, attended=128, recompute="full"
    )
    assert (
        plain["train_flops_per_token"]
        < selective["train_hardware_flops_per_token"]
        < full["train_hardware_flops_per_token"]
    )
    # full recomputation repeats the blocks' forward: at most 4/3 of the model count
    assert full["train_hardware_flops_per_token"] < 4 / 3 * plain["train_flops_per_token"]


def test_a_grid_reports_the_same_hardware_flops() -> None:
    grid = price_grid(ARCH, Workload(recompute="full"), None, "h100", n_layers=[2, 4])
    for i, n_layers in enumerate((2, 4)):
        one = price(ARCH.replace(n_layers=n_layers), Workload(recompute="full")).metrics()
        assert grid.metrics["train_hardware_flops_per_token"][i] == pytest.approx(
            one["train_hardware_flops_per_token"], rel=1e-12
        )


def test_a_training_sequence_longer_than_learned_positions_is_refused_as_seq_len() -> None:
    with pytest.raises(CostInputError) as err:
        price(ARCH, Workload(seq_len=256))
    assert err.value.field == "seq_len"
    assert "learned positions" in err.value.reason
    price(ARCH.replace(positions="rope"), Workload(seq_len=256))  # RoPE has no table
