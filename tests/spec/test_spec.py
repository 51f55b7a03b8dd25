"""Job specs: every bad spec is refused with the field and the reason; good ones enumerate
their candidates exactly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cost_model import ArchConfig, param_count
from nas_service.settings import ClusterSettings, get_settings
from nas_service.spec import (
    SpecError,
    build_candidate,
    check_job,
    enumerate_candidates,
    load_spec,
    parse_spec,
    space_size,
)
from tests.support.hostile import GOOD  # the one valid spec the spec tests vary

ROOT = Path(__file__).resolve().parents[2]


def with_(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    node = spec
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return spec


_DELETE = object()


def test_good_spec_and_its_candidates() -> None:
    spec = parse_spec(GOOD)
    assert space_size(spec) == 3 * 2 * (1 + 3)  # depths × widths × (baseline + 3 block sizes)
    cands = list(enumerate_candidates(spec))
    assert len(cands) == space_size(spec)
    # n_layers = 2 has 4 sublayers: S = 4 is fine; every candidate is valid here
    assert all(c.arch is not None for c in cands)
    block = [c for c in cands if c.params["variant"] == "block_attnres"]
    assert {c.params["block_size"] for c in block} == {1, 2, 4}
    assert all("block_size" not in c.params for c in cands if c.params["variant"] == "baseline")
    arch = build_candidate(
        spec, {"variant": "block_attnres", "n_layers": 4, "d_model": 128, "block_size": 2}
    ).arch
    assert arch == ArchConfig(
        n_layers=4, d_model=128, n_heads=4, seq_len=64, variant="block_attnres", block_size=2
    )
    valid = check_job(spec, get_settings())
    assert len(valid) == len(cands)


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        (with_("space.n_layers", {"low": 6, "high": 2}), "space.n_layers", "inverted range"),
        (with_("space.n_layers", []), "space.n_layers", "empty"),
        (with_("space.d_model", [64, 64]), "space.d_model", "duplicate"),
        (with_("space.d_model", [0, 64]), "space.d_model", "positive"),
        (
            with_("space.variants", ["baseline", "resnet"]),
            "space.variants",
            "unknown variant 'resnet'",
        ),
        (with_("space.block_sizes", _DELETE), "space", "block_sizes: needed"),
        (with_("space.params_target", {"params": 1e6}), "space", "exactly one of d_model"),
        (
            with_("budget", {"flops": 1e12, "tokens": 100}),
            "budget",
            "exactly one of flops and tokens",
        ),
        (with_("budget", {"flops": -1}), "budget.flops", "greater than 0"),
        (with_("n_trials", 0), "n_trials", "greater than or equal to 1"),
        (with_("objectives", ["val_loss", "beauty"]), "objectives", "unknown metric 'beauty'"),
        (
            with_("constraints", [{"metric": "vram", "max": 1}]),
            "constraints.0.metric",
            "unknown metric 'vram'",
        ),
        (with_("sampler", "bayes"), "sampler", "Input should be"),
        (with_("cost.hardware", "tpu"), "cost.hardware", "unknown preset 'tpu'"),
        (with_("cost.virtual", 2), "spec", "virtual stages need pipeline > 1"),
        (
            with_("pruner", "median") | {"objectives": ["val_loss", "params"]},
            "spec",
            "median needs a single objective",
        ),
        (with_("colour", "blue"), "colour", "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_name_field_and_reason(data: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    fields = {f: r for f, r in info.value.errors}
    assert field in fields, info.value.errors
    assert fragment in fields[field]


@pytest.mark.parametrize(
    ("data", "settings", "field", "fragment"),
    [
        (with_("n_trials", 50), {"max_trials": 20}, "n_trials", "over the limit of 20"),
        (with_("budget", {"flops": 1e22}), {}, "budget.flops", "over the limit"),
        (with_("cluster", "gpu-farm"), {}, "cluster", "unknown cluster 'gpu-farm'"),
        (with_("space.d_model", [100]), {}, "space", "no valid candidate"),
        (with_("budget", {"flops": 1e6}), {}, "budget.flops", "fewer than one optimizer step"),
        (with_("budget", {"tokens": 10}), {}, "budget.tokens", "fewer than one optimizer step"),
        (
            with_("space.n_layers", {"low": 1, "high": 10000})
            | {"space": GOOD["space"] | {"n_layers": {"low": 1, "high": 100000}}},
            {"max_candidates_enumerated": 1000},
            "space",
            "more than 1000 candidates",
        ),
    ],
)
def test_settings_dependent_checks(
    data: dict[str, Any], settings: dict[str, Any], field: str, fragment: str
) -> None:
    spec = parse_spec(data)
    with pytest.raises(SpecError) as info:
        check_job(spec, get_settings(**settings))
    assert info.value.field == field
    assert fragment in info.value.reason


def test_configured_cluster_is_accepted() -> None:
    settings = get_settings(
        clusters={"local": ClusterSettings(), "lab": ClusterSettings(address="127.0.0.1:6380")}
    )
    assert check_job(parse_spec(with_("cluster", "lab")), settings)


def test_params_target_sets_the_width() -> None:
    spec = parse_spec(
        with_(
            "space",
            {
                "n_layers": [2, 4, 8],
                "params_target": {"params": 3e5, "tolerance": 0.2},
                "head_dim": 8,
            },
        )
    )
    cands = list(enumerate_candidates(spec))
    assert [c.arch.n_layers for c in cands if c.arch] == [2, 4, 8]
    for c in cands:
        assert c.arch is not None
        assert abs(param_count(c.arch).total - 3e5) / 3e5 <= 0.2
    widths = [c.arch.d_model for c in cands if c.arch]
    assert widths == sorted(widths, reverse=True)  # deeper → narrower at fixed parameters


def test_params_target_gives_every_variant_of_a_depth_one_shape() -> None:
    """At 2e5 parameters and 8 blocks the target falls between d_model 40 and 48: solved per
    variant, AttnRes's few extra parameters tip it to another width than the baseline's, and
    the comparison would have no matched shape; solved for the Transformer, all share one."""
    space = {
        "n_layers": [2, 4, 8, 16],
        "params_target": {"params": 2e5, "tolerance": 0.25},
        "head_dim": 8,
        "variants": ["baseline", "block_attnres", "full_attnres", "mhc_lite", "denseformer"],
        "block_sizes": [4],
    }

    def widths(per_variant: bool) -> dict[int, set[int]]:
        target = space["params_target"] | {"per_variant": per_variant}  # type: ignore[operator]
        spec = parse_spec(with_("space", space | {"params_target": target}))
        out: dict[int, set[int]] = {}
        for c in enumerate_candidates(spec):
            assert c.arch is not None, c.reason
            out.setdefault(c.arch.n_layers, set()).add(c.arch.d_model)
            if per_variant:
                assert abs(param_count(c.arch).total - 2e5) / 2e5 <= 0.25
        return out

    shared = widths(per_variant=False)
    assert all(len(w) == 1 for w in shared.values()), shared
    assert [w.pop() for _, w in sorted(shared.items())] == [88, 64, 48, 32]
    assert {40, 48} <= widths(per_variant=True)[8]


def test_aspect_ratio_axis() -> None:
    spec = parse_spec(
        with_("space", {"n_layers": [2, 4], "aspect_ratio": [32.0, 64.0], "head_dim": 16})
    )
    archs = [c.arch for c in enumerate_candidates(spec)]
    assert [(a.n_layers, a.d_model) for a in archs if a] == [(2, 64), (2, 128), (4, 128), (4, 256)]


def test_invalid_points_carry_their_reason() -> None:
    spec = parse_spec(with_("space.n_heads", [3, 4]))
    bad = [c for c in enumerate_candidates(spec) if c.arch is None]
    assert bad and all("n_heads" in c.reason for c in bad)


def test_yaml_loading(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "examples" / "quick.yaml")
    assert spec.objectives == ["val_loss", "train_memory_bytes"]
    assert check_job(spec, get_settings())
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(listy)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_is_valid(path: Path) -> None:
    spec = load_spec(path)
    clusters = {"local": ClusterSettings(), spec.cluster: ClusterSettings()}
    settings = get_settings(clusters=clusters)
    seeds = max(spec.seeds, spec.confirm_seeds)
    if seeds > settings.max_seeds:  # an example over the default limit says what to raise
        assert f"DEPTHSCOPE_MAX_SEEDS={seeds}" in path.read_text()
        settings = get_settings(clusters=clusters, max_seeds=seeds)
    assert check_job(spec, settings)


def test_several_budgets_become_a_searched_axis() -> None:
    from nas_service.search.pricing import price_candidate
    from nas_service.search.study import grid_space

    spec = parse_spec(GOOD | {"budget": {"flops": [1e12, 4e12]}})
    assert grid_space(spec)["budget"] == [1e12, 4e12]
    params = {"residual": "baseline", "n_layers": 2, "d_model": 64, "budget": 4e12}
    priced = price_candidate(spec, params)
    assert priced.train_spec is not None and priced.train_spec.budget_flops == 4e12
    with pytest.raises(SpecError, match="duplicate"):
        parse_spec(GOOD | {"budget": {"flops": [1e12, 1e12]}})


# -- multi-fidelity -----------------------------------------------------------------------------
FIDELITY = {"rungs": [0.111, 0.333, 1.0], "reduction": 3, "brackets": 2}


def test_a_wsd_spec_with_fidelity_parses_and_passes_check_job(tmp_path: Path) -> None:
    data = with_("fidelity", FIDELITY)
    data["training"] |= {"schedule": "wsd", "decay_frac": 0.3}
    spec = parse_spec(data)
    assert spec.fidelity is not None
    assert spec.fidelity.rungs == [0.111, 0.333, 1.0]
    assert (spec.fidelity.reduction, spec.fidelity.brackets) == (3.0, 2)
    assert spec.fidelity.reuse == "checkpoint"  # the default
    store = tmp_path / "store"
    assert len(check_job(spec, get_settings(artifact_store=str(store)))) == space_size(spec)
    assert list(store.rglob("*")) == []  # the probe was cleaned up
    with pytest.raises(ValidationError):  # frozen, like every part of a spec
        spec.fidelity.brackets = 3


def test_retrain_needs_no_wsd_and_no_checkpoint_in_the_stable_phase() -> None:
    spec = parse_spec(with_("fidelity", FIDELITY | {"rungs": [0.5, 0.95, 1.0], "reuse": "retrain"}))
    assert spec.training.schedule == "cosine"
    assert spec.fidelity is not None and spec.fidelity.reuse == "retrain"
    assert parse_spec(GOOD).fidelity is None  # a job without the section trains full budgets


def test_decay_frac_reaches_the_train_spec() -> None:
    from nas_service.search.pricing import price_candidate

    data = with_("training.schedule", "wsd")
    data["training"]["decay_frac"] = 0.35
    params = {"residual": "baseline", "n_layers": 2, "d_model": 64}
    priced = price_candidate(parse_spec(data), params)
    assert priced.train_spec is not None
    assert (priced.train_spec.schedule, priced.train_spec.decay_frac) == ("wsd", 0.35)
    default = price_candidate(parse_spec(GOOD), params).train_spec
    assert default is not None and default.decay_frac == 0.2
