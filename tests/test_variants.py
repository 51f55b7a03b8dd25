"""One vocabulary of residual variants: the cost side (`cost_model.Variant`, `VARIANTS` and the
registry of `cost_model.residuals`), the model side (`workers.model.MIXERS`) and the job spec
(`nas_service.spec`) know exactly the same names."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from cost_model import VARIANTS, Variant
from cost_model.residuals import RESIDUALS
from nas_service.spec import SpecError, parse_spec
from workers.model import MIXERS

SPEC: dict[str, Any] = {
    "name": "variants",
    "space": {"n_layers": [2], "d_model": [32], "head_dim": 16},
    "budget": {"tokens": 4 * 32 * 16},
    "objectives": ["val_loss", "params"],
    "sampler": "grid",
    "pruner": "none",
    "n_trials": 1,
    "training": {"seq_len": 32, "batch_size": 4, "n_evals": 2, "eval_batches": 2, "threads": 1},
    "cost": {"hardware": "cpu"},
}


def spec_with(variants: list[str]) -> dict[str, Any]:
    space = SPEC["space"] | {"variants": variants}
    if "block_attnres" in variants:
        space["block_sizes"] = [2]
    return SPEC | {"space": space}


def test_cost_and_model_sides_know_the_same_variants() -> None:
    assert get_args(Variant) == VARIANTS
    assert len(set(VARIANTS)) == len(VARIANTS)
    assert set(RESIDUALS) == set(VARIANTS)
    assert set(MIXERS) == set(VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_job_spec_accepts_every_variant(variant: str) -> None:
    assert parse_spec(spec_with([variant])).space.variants == [variant]


def test_the_job_spec_accepts_all_variants_together() -> None:
    assert parse_spec(spec_with(list(VARIANTS))).space.variants == list(VARIANTS)


@pytest.mark.parametrize("unknown", ["attnres", "Full_AttnRes", "mhc", "block_attnres/S=2", ""])
def test_the_job_spec_refuses_any_other_name(unknown: str) -> None:
    assert unknown not in VARIANTS
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_with(["baseline", unknown]))
    assert (
        "space.variants",
        f"unknown variant {unknown!r}; expected one of {', '.join(VARIANTS)}",
    ) in refused.value.errors
