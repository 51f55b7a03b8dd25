"""What the hostile-spec tests share: a good spec (`GOOD`) and one with fields changed
(`with_`), the refusal a call raises and the reason given for a field."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from nas_service.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]


GOOD: dict[str, Any] = {
    "name": "t",
    "space": {
        "n_layers": {"low": 2, "high": 6, "step": 2},
        "d_model": [64, 128],
        "head_dim": 32,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1, 2, 4],
    },
    "budget": {"flops": 1e12},
    "n_trials": 10,
    "training": {"seq_len": 64, "batch_size": 8},
}


BILLION = 10**9


INF, NAN = float("inf"), float("nan")


def with_(*changes: tuple[str, Any]) -> dict[str, Any]:
    """GOOD with each (dotted path, value) set."""
    spec = copy.deepcopy(GOOD)
    for path, value in changes:
        node = spec
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return spec


def refusal(call: Any, *args: Any) -> tuple[list[tuple[str, str]], float]:
    """The (field, reason) list of the SpecError `call(*args)` raises, and how long it took."""
    start = time.perf_counter()
    with pytest.raises(SpecError) as info:
        call(*args)
    elapsed = time.perf_counter() - start
    return info.value.errors, elapsed


def reason_of(errors: list[tuple[str, str]], field: str) -> str:
    """The reason given for `field` (the only one)."""
    reasons = [r for f, r in errors if f == field]
    assert len(reasons) == 1, errors
    return reasons[0]


def assert_refused(errors: list[tuple[str, str]], field: str, fragment: str) -> None:
    assert any(f == field and fragment in r for f, r in errors), errors


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump({k: v for k, v in data.items() if k not in ("budget",)})
