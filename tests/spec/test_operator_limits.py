"""Every operator limit of `check_job` at its edge: a value exactly at the limit is accepted,
and the same spec under a limit just below it (one less, or the next float down) is refused
on the field, saying the limit. A `>=` where `>` is meant (or the reverse) fails here."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cost_model import flops_for_tokens, param_count
from nas_service.settings import Settings, get_settings
from nas_service.spec import JobSpec, SpecError, check_job, parse_spec, space_size
from nas_service.spec.candidates import enumerate_candidates
from tests.support.hostile import GOOD, with_


def _archs(spec: JobSpec) -> list[Any]:
    return [c.arch for c in enumerate_candidates(spec) if c.arch is not None]


@dataclass(frozen=True)
class Edge:
    """`data` refused on `field` once `setting` is just below `value` (the spec's value, or a
    function of the parsed spec), accepted with `setting` at it."""

    data: dict[str, Any]
    setting: str
    value: float | Callable[[JobSpec], float]
    field: str
    says: str = "limit"


TOKENS = ("budget", {"tokens": 1_000_000})
EDGES: dict[str, Edge] = {
    "n_trials": Edge(GOOD, "max_trials", 10, "n_trials"),
    "budget.flops": Edge(GOOD, "max_budget_flops", 1e12, "budget.flops"),
    "budget.tokens": Edge(with_(TOKENS), "max_budget_tokens", 1e6, "budget.tokens"),
    "budget-axis": Edge(
        with_(("budget", {"flops": [1e12, 2e12, 3e12]})), "max_axis_values", 3, "budget.flops"
    ),
    "max_concurrent": Edge(
        with_(("max_concurrent", 4)), "max_concurrent_trials", 4, "max_concurrent"
    ),
    "seeds": Edge(with_(("seeds", 3)), "max_seeds", 3, "seeds"),
    "training-axis": Edge(
        with_(("training.lr", [1e-3, 2e-3, 3e-3, 4e-3])), "max_axis_values", 4, "training.lr"
    ),
    "tune-axis": Edge(
        with_(("tune", {"lr": [1e-3, 2e-3, 3e-3, 4e-3]})), "max_axis_values", 4, "tune.lr"
    ),
    "job-runs": Edge(with_(("seeds", 2)), "max_job_runs", 20, "n_trials"),
    "job-runs-tune": Edge(with_(("tune", {"lr": [1e-3, 2e-3]})), "max_job_runs", 20, "tune"),
    "space-size": Edge(
        GOOD, "max_candidates_enumerated", lambda s: float(space_size(s)), "space", "more than"
    ),
    "space-axis": Edge(
        with_(("space.n_layers", [2, 3, 4, 5, 6])), "max_axis_values", 5, "space.n_layers"
    ),
    "n_layers": Edge(GOOD, "max_n_layers", 6, "space.n_layers"),
    "block_sizes": Edge(
        with_(("space.n_layers", [6]), ("space.block_sizes", [1, 12])),
        "max_n_layers",
        6,  # S counts sublayers: 2 · max_n_layers
        "space.block_sizes",
    ),
    "d_model": Edge(GOOD, "max_d_model", 128, "space.d_model"),
    "n_heads": Edge(
        with_(("space.n_heads", [2, 64]), ("space.d_model", [64])),
        "max_d_model",
        64,
        "space.n_heads",
    ),
    "head_dim": Edge(
        with_(("space.head_dim", 128), ("space.d_model", [128])),
        "max_d_model",
        128,
        "space.head_dim",
    ),
    "params_target": Edge(  # every candidate built under the target (19.8M)
        with_(("space.d_model", None), ("space.params_target", {"params": 2e7})),
        "max_params",
        2e7,
        "space.params_target.params",
    ),
    "aspect_ratio-width": Edge(
        with_(("space.d_model", None), ("space.aspect_ratio", [32])),
        "max_d_model",
        lambda s: max(a.d_model for a in _archs(s)),
        "space.aspect_ratio",
    ),
    "params": Edge(
        GOOD, "max_params", lambda s: max(param_count(a).total for a in _archs(s)), "space"
    ),
    "job-flops": Edge(GOOD, "max_job_flops", 10 * 1e12, "budget"),
    "job-flops-tokens": Edge(
        with_(TOKENS),
        "max_job_flops",
        lambda s: 10 * max(flops_for_tokens(a, 1_000_000) for a in _archs(s)),
        "budget",
    ),
    "training.seq_len": Edge(GOOD, "max_seq_len", 64, "training.seq_len"),
    "training.batch_size": Edge(GOOD, "max_batch_size", 8, "training.batch_size"),
    "training.threads": Edge(with_(("training.threads", 8)), "max_threads", 8, "training.threads"),
    "cost.seq_len": Edge(with_(("cost.seq_len", 256)), "max_seq_len", 256, "cost.seq_len"),
    "cost.decode_context": Edge(
        with_(("cost.decode_context", 512)), "max_seq_len", 512, "cost.decode_context"
    ),
    "cost.micro_batch": Edge(
        with_(("cost.micro_batch", 16)), "max_batch_size", 16, "cost.micro_batch"
    ),
}


def _below(value: float, integer: bool) -> float:
    return value - 1 if integer else math.nextafter(value, -math.inf)


@pytest.mark.parametrize("case", list(EDGES), ids=list(EDGES))
def test_a_value_at_the_limit_is_accepted_and_past_it_refused(case: str) -> None:
    edge = EDGES[case]
    spec = parse_spec(edge.data)
    value = edge.value(spec) if callable(edge.value) else edge.value
    integer = Settings.model_fields[edge.setting].annotation is int
    at = int(value) if integer else float(value)
    assert check_job(spec, get_settings(**{edge.setting: at}))
    with pytest.raises(SpecError) as refused:
        check_job(spec, get_settings(**{edge.setting: _below(at, integer)}))
    reasons = dict(refused.value.errors)
    assert edge.field in reasons, refused.value.errors
    assert edge.says in reasons[edge.field]


def test_the_edges_cover_every_operator_limit_check_job_applies() -> None:
    checked = {edge.setting for edge in EDGES.values()}
    assert checked == {
        "max_trials",
        "max_budget_flops",
        "max_budget_tokens",
        "max_axis_values",
        "max_concurrent_trials",
        "max_seeds",
        "max_job_runs",
        "max_candidates_enumerated",
        "max_n_layers",
        "max_d_model",
        "max_params",
        "max_job_flops",
        "max_seq_len",
        "max_batch_size",
        "max_threads",
    }


def test_a_budget_of_exactly_one_step_and_a_first_rung_of_exactly_one_step_are_accepted() -> None:
    step = 8 * 64  # GOOD's batch_size × seq_len
    assert check_job(parse_spec(with_(("budget", {"tokens": step}))), get_settings())
    with pytest.raises(SpecError) as refused:
        check_job(parse_spec(with_(("budget", {"tokens": step - 1}))), get_settings())
    assert "fewer than one optimizer step" in dict(refused.value.errors)["budget.tokens"]
    for first, accepted in ((0.5, True), (math.nextafter(0.5, 0), False)):
        data = with_(
            ("budget", {"tokens": 2 * step}),
            ("fidelity", {"rungs": [first, 1.0]}),
            ("training.schedule", "wsd"),
        )
        if accepted:
            assert check_job(parse_spec(data), get_settings())
            continue
        with pytest.raises(SpecError) as refused:
            check_job(parse_spec(data), get_settings())
        assert "fewer than one optimizer step" in dict(refused.value.errors)["fidelity.rungs"]
