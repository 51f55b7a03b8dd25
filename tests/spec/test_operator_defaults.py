"""The operator limits' defaults fit the machine the service runs on: no candidate bigger
than its memory can train, no candidate budget of a data centre's year."""

from __future__ import annotations

import pytest

from nas_service.settings import (
    DEFAULT_MAX_BUDGET_FLOPS,
    TRAINING_BYTES_PER_PARAM,
    default_max_params,
    get_settings,
    machine_memory_bytes,
)
from nas_service.spec import SpecError, check_job, parse_spec
from tests.support.jobs import TINY


def _refusal(data: dict[str, object], **settings: object) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        check_job(parse_spec(data), get_settings(**settings))
    return dict(info.value.errors)


def test_the_default_parameter_limit_is_what_this_machine_can_train() -> None:
    memory = machine_memory_bytes()
    assert memory is not None and memory > 0
    limit = get_settings().max_params
    assert limit == default_max_params(memory)
    assert 0.9 * memory / TRAINING_BYTES_PER_PARAM <= limit <= memory / TRAINING_BYTES_PER_PARAM
    assert default_max_params(24 * 2**30) == 1.6e9  # two significant digits, rounded down
    assert default_max_params(141 * 2**30) == 9.4e9


def test_a_candidate_larger_than_the_machine_s_memory_is_refused_by_default() -> None:
    """A 64-block, 12,288-wide candidate (~116e9 parameters: ~1.9 TB to train) was under the
    old default of 1e11 per candidate; now it is refused, naming the limit, unless the
    operator raises it."""
    memory = machine_memory_bytes()
    assert memory is not None and memory < 116e9 * TRAINING_BYTES_PER_PARAM
    big = TINY | {"space": TINY["space"] | {"n_layers": [64], "d_model": [12288], "head_dim": 128}}
    errors = _refusal(big)
    assert "space" in errors and "parameters, over the limit of" in errors["space"]
    assert f"{get_settings().max_params:.3g}" in errors["space"]
    assert check_job(parse_spec(big), get_settings(max_params=2e11))  # raised by the operator


def test_the_default_budget_per_candidate_is_conservative() -> None:
    """1e20 FLOPs per candidate (a month of a large GPU) passed the old default of 1e21; the
    default is now 1e18, and the refusal names the field and the limit."""
    assert get_settings().max_budget_flops == DEFAULT_MAX_BUDGET_FLOPS == 1e18
    errors = _refusal(TINY | {"budget": {"flops": 1e20}})
    assert errors["budget.flops"] == "1e+20 is over the limit of 1e+18"
    assert check_job(parse_spec(TINY | {"budget": {"flops": 1e18}}), get_settings())
    with pytest.raises(SpecError):
        check_job(parse_spec(TINY | {"budget": {"flops": 1e20}}), get_settings())
    assert check_job(
        parse_spec(TINY | {"budget": {"flops": 1e20}}), get_settings(max_budget_flops=1e21)
    )
