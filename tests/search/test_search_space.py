"""One description of the search space: the grid sampler's space, a trial's suggestion and
the enumerated candidates are the same set; the `residual` codec round-trips and refuses
what it never writes; `TrainSpec` carries every training field."""

from __future__ import annotations

import itertools
from typing import Any

import optuna
import pytest

from nas_service.search.pricing import price_candidate
from nas_service.search.study import grid_space, make_sampler, suggest
from nas_service.spec import (
    CandidateSpace,
    Training,
    build_candidate,
    decode_residual,
    encode_residual,
    enumerate_candidates,
    parse_spec,
    space_size,
)

optuna.logging.set_verbosity(optuna.logging.ERROR)

BASE: dict[str, Any] = {
    "name": "t",
    "budget": {"flops": 1e12},
    "n_trials": 10,
    "training": {"seq_len": 64, "batch_size": 8},
}
SPACES: dict[str, dict[str, Any]] = {
    "blocks": {
        "space": {
            "n_layers": {"low": 2, "high": 6, "step": 2},
            "d_model": [64, 128],
            "head_dim": 32,
            "variants": ["baseline", "block_attnres", "full_attnres"],
            "block_sizes": [1, 2, 4],
        }
    },
    "aspect-heads-budgets": {
        "space": {
            "n_layers": [2, 4],
            "aspect_ratio": [16.0, 32.0, 64.0],
            "n_heads": {"low": 1, "high": 4},
            "head_dim": 16,
            "variants": ["baseline", "block_attnres"],
            "block_sizes": {"low": 2, "high": 6, "step": 2},
        },
        "budget": {"flops": [1e12, 2e12, 4e12]},
    },
    "params-target-tokens": {
        "space": {
            "n_layers": [2, 4, 8],
            "params_target": {"params": 3e5, "tolerance": 0.3},
            "head_dim": 8,
            "variants": ["mhc_lite", "denseformer"],
        },
        "budget": {"tokens": [4096, 8192]},
    },
    "one-variant": {
        "space": {"n_layers": [3], "d_model": {"low": 32, "high": 96, "step": 32}},
    },
}


def spec_of(name: str) -> Any:
    return parse_spec(BASE | SPACES[name])


def frozen(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def enumerated(spec: Any) -> set[tuple[tuple[str, Any], ...]]:
    """The candidates × the budgets (`budget` a parameter only when there are several)."""
    budgets = spec.budget.values()
    out = set()
    for c in enumerate_candidates(spec):
        for b in budgets:
            out.add(frozen(c.params | ({"budget": b} if len(budgets) > 1 else {})))
    return out


@pytest.mark.parametrize("name", sorted(SPACES))
def test_grid_suggestions_and_candidates_are_one_set(name: str) -> None:
    spec = spec_of(name)
    expected = enumerated(spec)
    assert len(expected) == space_size(spec) * len(spec.budget.values())
    # the grid sampler's space, point by point, read back as candidates
    grid = grid_space(spec)
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    assert len(points) == len(expected)
    assert {frozen(CandidateSpace.from_study(p)) for p in points} == expected
    # a study on the grid sampler suggests every point exactly once
    study = optuna.create_study(sampler=make_sampler(spec.model_copy(update={"sampler": "grid"})))
    seen = []
    for _ in range(len(points)):
        trial = study.ask()
        seen.append(frozen(CandidateSpace.from_study(suggest(trial, spec))))
        study.tell(trial, 0.0)
    assert sorted(seen) == sorted(expected)
    # the other samplers stay inside the same set
    study = optuna.create_study(sampler=make_sampler(spec.model_copy(update={"sampler": "random"})))
    for _ in range(50):
        trial = study.ask()
        assert frozen(CandidateSpace.from_study(suggest(trial, spec))) in expected
        study.tell(trial, 0.0)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_a_trial_prices_the_enumerated_architecture(name: str) -> None:
    spec = spec_of(name)
    space = CandidateSpace(spec)
    budget = {"budget": spec.budget.values()[-1]} if len(spec.budget.values()) > 1 else {}
    for candidate in enumerate_candidates(spec):
        study_params = CandidateSpace.to_study(candidate.params | budget)
        assert set(study_params) == {a.name for a in space.study_axes()}
        assert CandidateSpace.from_study(study_params) == candidate.params | budget
        priced = price_candidate(spec, study_params)
        assert priced.arch_dict == (candidate.arch.to_dict() if candidate.arch else None)
        if priced.train_spec is not None:
            kind = spec.budget.kind
            got = getattr(priced.train_spec, f"budget_{kind}")
            assert got == spec.budget.values()[-1]
            assert type(got) is (float if kind == "flops" else int)


def test_the_stored_parameters_stay_readable() -> None:
    """Studies already in a database hold `residual` as a variant or `block_attnres/S=<S>`."""
    spec = spec_of("blocks")
    assert grid_space(spec)["residual"] == [
        "baseline",
        "block_attnres/S=1",
        "block_attnres/S=2",
        "block_attnres/S=4",
        "full_attnres",
    ]
    assert list(grid_space(spec)) == ["residual", "n_layers", "d_model"]
    assert list(grid_space(spec_of("aspect-heads-budgets"))) == [
        "residual",
        "n_layers",
        "aspect_ratio",
        "n_heads",
        "budget",
    ]
    stored = {"residual": "block_attnres/S=4", "n_layers": 4, "d_model": 128}
    priced = price_candidate(spec, stored)
    assert priced.arch_dict is not None
    assert (priced.arch_dict["variant"], priced.arch_dict["block_size"]) == ("block_attnres", 4)
    assert priced.arch_dict["n_heads"] == 4  # d_model / head_dim
    assert decode_residual("baseline") == {"variant": "baseline"}


def test_the_residual_codec_round_trips() -> None:
    assert encode_residual("block_attnres", {"block_size": 8, "n_layers": 3}) == "block_attnres/S=8"
    assert encode_residual("mhc_lite", {"block_size": 8}) == "mhc_lite"
    for name in SPACES:
        for value in CandidateSpace(spec_of(name)).grid()["residual"]:
            decoded = decode_residual(value)
            assert encode_residual(decoded["variant"], decoded) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("block_attnres", "needs S"),
        ("block_attnres/S=x", "whole number"),
        ("block_attnres/S=-2", "whole number"),
        ("block_attnres/S=", "whole number"),
        ("block_attnres/S=4/S=4", "given twice"),
        ("block_attnres/Q=4", "unknown part"),
        ("block_attnres/S4", "unknown part"),
        ("baseline/S=4", "has no block_size"),
    ],
)
def test_the_residual_codec_refuses_what_it_never_writes(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        decode_residual(value)


def test_a_residual_outside_the_space_fails_the_suggestion() -> None:
    spec = spec_of("blocks")
    study = optuna.create_study()
    study.enqueue_trial({"residual": "block_attnres/S=3", "n_layers": 2, "d_model": 64})
    with pytest.raises(ValueError, match="not in"):
        suggest(study.ask(), spec)


def test_conditional_axes_only_for_their_variants() -> None:
    spec = spec_of("blocks")
    space = CandidateSpace(spec)
    assert [a.name for a in space.axes()] == ["variant", "n_layers", "d_model", "block_size"]
    block = next(a for a in space.axes() if a.name == "block_size")
    assert block.applies_to("block_attnres") and not block.applies_to("baseline")
    assert space.size() == 3 * 2 * (1 + 3 + 1)
    # a conditional parameter given for another variant is ignored
    arch = build_candidate(
        spec, {"variant": "baseline", "n_layers": 2, "d_model": 64, "block_size": 2}
    ).arch
    assert arch is not None and arch.block_size is None


def test_the_train_spec_carries_every_training_field() -> None:
    training = {
        "corpus": "plays",
        "vocab_size": 300,
        "seq_len": 32,
        "batch_size": 4,
        "lr": 1e-3,
        "depth_lr_mult": 0.5,
        "decay_frac": 0.3,
        "schedule": "wsd",
        "warmup_frac": 0.2,
        "weight_decay": 0.01,
        "n_evals": 3,
        "eval_batches": 2,
        "threads": 2,
        "text_field": "body",
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
    }
    assert set(training) == set(Training.model_fields)  # a new field: add it here
    one = SPACES["one-variant"]  # with a variant that has depth-mixing parameters
    space = one["space"] | {"variants": ["mhc_lite"]}
    spec = parse_spec(BASE | one | {"space": space, "training": training})
    params = {"residual": "mhc_lite", "n_layers": 3, "d_model": 64}
    ts = price_candidate(spec, params, seed=7).train_spec
    assert ts is not None
    assert (ts.tokenizer, ts.tokenizer_vocab) == ("bpe", 300)  # the section as two fields
    for name, value in training.items():
        if name == "tokenizer":
            continue
        holder = ts.arch if name in Training.ARCH_FIELDS else ts
        assert getattr(holder, name) == value, name
    assert ts.seed == 7 and ts.budget_flops == 1e12 and ts.budget_tokens is None
    resolved = price_candidate(spec, params, corpus="/data/plays.txt").train_spec
    assert resolved is not None and resolved.corpus == "/data/plays.txt"
    assert price_candidate(spec, params, corpus=None).train_spec.corpus is None  # type: ignore[union-attr]


def test_every_axis_is_a_field_of_the_space() -> None:
    from nas_service.spec import AXES, SearchSpace

    assert {d.field for d in AXES} <= set(SearchSpace.model_fields)
    assert AXES[0].name == "variant"  # the conditional axes depend on it
    tags = [d.tag for d in AXES if d.tag is not None]
    assert len(tags) == len(set(tags)) and all(d.variants for d in AXES if d.tag)
