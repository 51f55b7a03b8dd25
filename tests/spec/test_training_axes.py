"""Training hyper-parameters as search axes: each of `TRAINING_AXES` fixed, given as choices
or as a range (joint: a study parameter under its own name), or listed in `tune` (the
per-shape nested grid); the refusals, each naming its field; a trial's setting and its
nested grid; the `TrainSpec` a trial trains with; the cost metrics computed once per
architecture."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import optuna
import pytest

import nas_service.search.pricing as search
from cost_model import VARIANTS, ArchConfig, get_hardware, param_count, price
from cost_model.residuals import DEPTH_MIXED, RESIDUALS
from nas_service.search.pricing import price_candidate
from nas_service.search.study import (
    TRAINING_AXES,
    grid_space,
    make_sampler,
    runs_per_trial,
    suggest,
    training_setting,
    tune_settings,
)
from nas_service.settings import get_settings
from nas_service.spec import (
    CandidateSpace,
    FloatRange,
    JobSpec,
    SpecError,
    Tune,
    build_candidate,
    check_job,
    parse_spec,
)
from tests.support.hostile import GOOD, with_

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

optuna.logging.set_verbosity(optuna.logging.ERROR)

LOG_LR = {"low": 1e-4, "high": 1e-1, "log": True}


def spec_with(*changes: tuple[str, Any]) -> JobSpec:
    return parse_spec(with_(*changes))


def errors_of(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return dict(info.value.errors)


# -- the forms ---------------------------------------------------------------------------------
def test_the_contract_s_axes() -> None:
    assert TRAINING_AXES == ("lr", "depth_lr_mult", "warmup_frac", "weight_decay")
    assert set(Tune.model_fields) == set(TRAINING_AXES)


@pytest.mark.parametrize("axis", ["lr", "depth_lr_mult", "warmup_frac", "weight_decay"])
def test_each_axis_takes_a_value_choices_or_a_range(axis: str) -> None:
    single = spec_with((f"training.{axis}", 0.25))
    assert getattr(single.training, axis) == 0.25
    assert single.training.searched() == {}
    choices = spec_with((f"training.{axis}", [0.25, 0.5]))
    assert getattr(choices.training, axis) == [0.25, 0.5]
    assert choices.training.searched() == {axis: [0.25, 0.5]}
    linear = spec_with((f"training.{axis}", {"low": 0.125, "high": 0.75}))
    assert getattr(linear.training, axis) == FloatRange(low=0.125, high=0.75, log=False)
    log = spec_with((f"training.{axis}", {"low": 0.01, "high": 0.5, "log": True}))
    assert getattr(log.training, axis) == FloatRange(low=0.01, high=0.5, log=True)
    tuned = spec_with(("tune", {axis: [0.25, 0.5, 0.75]}))
    assert tuned.tune is not None and tuned.tune.axes() == {axis: [0.25, 0.5, 0.75]}
    # every form is stored as JSON and read back the same (the runner re-reads the spec)
    for spec in (single, choices, linear, log, tuned):
        assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_the_defaults_are_today_s_fixed_values() -> None:
    spec = parse_spec(GOOD)
    assert spec.training.fixed() == {
        "lr": 3e-3,
        "depth_lr_mult": 1.0,
        "warmup_frac": 0.05,
        "weight_decay": 0.1,
    }
    assert spec.tune is None and spec.tune_size == 1 and spec.runs == spec.n_trials


# -- what is refused ---------------------------------------------------------------------------
BASELINE_ONLY = (("space.variants", ["baseline"]), ("space.block_sizes", None))


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ((("training.lr", []),), "training.lr", "empty: give at least one value"),
        ((("training.lr", [1e-3, 1e-3]),), "training.lr", "duplicate values"),
        ((("training.lr", {"low": 1e-2, "high": 1e-3}),), "training.lr", "inverted range"),
        ((("training.lr", {"low": 1e-2, "high": 1e-2}),), "training.lr", "give a single value"),
        (
            (("training.depth_lr_mult", {"low": 0, "high": 10, "log": True}),),
            "training.depth_lr_mult",
            "a log range needs positive bounds, got low 0",
        ),
        (
            (("training.weight_decay", {"low": -1, "high": 1, "log": True}),),
            "training.weight_decay",
            "a log range needs positive bounds",
        ),
        ((("training.lr", 0),), "training.lr", "0 is outside (0, 1000]"),
        ((("training.lr", [1e-3, 5e3]),), "training.lr", "value 1 (5000) is outside (0, 1000]"),
        ((("training.lr", {"low": 1e-3, "high": 2e3}),), "training.lr", "high 2000 is outside"),
        ((("training.depth_lr_mult", 1e4),), "training.depth_lr_mult", "outside [0, 1000]"),
        ((("training.depth_lr_mult", -0.5),), "training.depth_lr_mult", "outside [0, 1000]"),
        ((("training.warmup_frac", [0.1, 1.5]),), "training.warmup_frac", "outside [0, 1]"),
        ((("training.weight_decay", -1),), "training.weight_decay", "outside [0, 1000]"),
        ((("training.lr", True),), "training.lr", "must be a number, not true"),
        ((("training.lr", [1e-3, False]),), "training.lr", "must be a number, not false"),
        ((("training.lr", "fast"),), "training.lr", "must be a number, got 'fast'"),
        ((("training.lr", None),), "training.lr", "a list of choices or a range"),
        ((("training.lr", [1e-3, math.nan]),), "training.lr", "finite"),
        ((("training.lr", {"low": 1e-3, "high": math.inf}),), "training.lr.high", "finite"),
        (
            (("tune", {"lr": [1e-3], "momentum": [0.9]}),),
            "tune.momentum",
            "unknown training axis 'momentum'; expected one of lr, depth_lr_mult, "
            "warmup_frac, weight_decay",
        ),
        ((("tune", {"lr": []}),), "tune.lr", "empty"),
        ((("tune", {"lr": [1e-3, 1e-3]}),), "tune.lr", "duplicate"),
        ((("tune", {"warmup_frac": [0.5, 2]}),), "tune.warmup_frac", "outside [0, 1]"),
        ((("tune", {"lr": 1e-3}),), "tune.lr", "must be a list"),
        ((("tune", {"lr": {"low": 1e-3, "high": 1e-2}}),), "tune.lr", "must be a list"),
        (
            (("tune", {"lr": [1e-3, 3e-3]}), ("training.lr", {"low": 1e-4, "high": 1e-2})),
            "tune.lr",
            "also searched jointly in training.lr",
        ),
        (
            (("sampler", "grid"), ("training.lr", {"low": 1e-4, "high": 1e-2})),
            "training.lr",
            "the grid sampler needs choices, not a range",
        ),
        (
            (*BASELINE_ONLY, ("training.depth_lr_mult", 2.0)),
            "training.depth_lr_mult",
            "none of the variants (baseline) has depth-mixing parameters",
        ),
        (
            (*BASELINE_ONLY, ("training.depth_lr_mult", [0.5, 1.0])),
            "training.depth_lr_mult",
            "none of the variants (baseline) has depth-mixing parameters",
        ),
        (
            (*BASELINE_ONLY, ("tune", {"depth_lr_mult": [0.1, 1.0]})),
            "tune.depth_lr_mult",
            "none of the variants (baseline) has depth-mixing parameters",
        ),
    ],
)
def test_a_bad_training_axis_is_refused_on_its_field(
    changes: tuple[tuple[str, Any], ...], field: str, fragment: str
) -> None:
    errors = errors_of(with_(*changes))
    assert field in errors, errors
    assert fragment in errors[field], errors


def test_an_axis_searched_both_ways_names_both_fields() -> None:
    errors = errors_of(with_(("tune", {"lr": [1e-3, 3e-3]}), ("training.lr", [1e-3, 1e-2])))
    assert list(errors) == ["tune.lr"]
    assert "training.lr" in errors["tune.lr"]


def test_what_stays_accepted() -> None:
    # a fixed axis beside a tuned one of the same name: tune varies it
    assert spec_with(("tune", {"lr": [1e-3, 3e-3]}), ("training.lr", 1e-3)).tune_size == 2
    # choices under the grid sampler
    assert spec_with(("sampler", "grid"), ("training.lr", [1e-3, 3e-3])).sampler == "grid"
    # depth_lr_mult at its default with the baseline only, or searched with a mixing variant
    assert spec_with(*BASELINE_ONLY).training.depth_lr_mult == 1.0
    mixed = spec_with(
        ("space.variants", ["baseline", "full_attnres"]),
        ("space.block_sizes", None),
        ("tune", {"depth_lr_mult": [0.1, 1, 10]}),
    )
    assert mixed.tune_size == 3
    # boundaries of each axis: warmup 0 and 1, weight decay 0, depth_lr_mult 0 (frozen)
    spec = spec_with(
        ("training.warmup_frac", [0.0, 1.0]),
        ("training.weight_decay", 0.0),
        ("training.depth_lr_mult", [0.0, 1e3]),
        ("training.lr", 1e3),
    )
    assert spec.training.searched() == {"depth_lr_mult": [0.0, 1e3], "warmup_frac": [0.0, 1.0]}


def test_depth_mixed_variants_are_those_with_mixing_parameters() -> None:
    """`DEPTH_MIXED` agrees with the cost model's parameter counts: every variant but the
    standard residual has parameters in its wiring."""
    assert set(RESIDUALS) == set(VARIANTS)
    for variant in VARIANTS:
        residual = RESIDUALS[variant]
        extra: dict[str, Any] = {}
        if residual.has_block_size:
            extra["block_size"] = 2
        if residual.has_streams:
            extra["mhc_streams"] = 2
        arch = ArchConfig(n_layers=4, d_model=64, n_heads=2, variant=residual.name, **extra)
        counts = param_count(arch)
        has = counts.depth_mixing + counts.depth_aggregation > 0
        assert has == (variant in DEPTH_MIXED), variant
    assert sorted(DEPTH_MIXED) == sorted(set(VARIANTS) - {"baseline"})


# -- sizes and limits ---------------------------------------------------------------------------
def test_the_runs_of_a_job_count_every_tune_setting() -> None:
    spec = spec_with(
        ("seeds", 3),
        ("tune", {"lr": [1e-3, 3e-3, 1e-2], "weight_decay": [0.0, 0.1]}),
    )
    assert spec.tune_size == 6
    assert runs_per_trial(spec) == 3 * 6
    assert spec.runs == spec.n_trials * 3 * 6
    assert runs_per_trial(spec_with(("seeds", 2))) == 2


def _refused(spec: JobSpec, **settings: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        check_job(spec, get_settings(**settings))
    return dict(info.value.errors)


def test_max_job_runs_names_tune_or_n_trials() -> None:
    tune = {"lr": [1e-3 * (i + 1) for i in range(10)], "warmup_frac": [i / 10 for i in range(10)]}
    spec = spec_with(("n_trials", 100), ("seeds", 3), ("tune", tune))
    assert spec.runs == 30_000
    errors = _refused(spec)
    assert errors["tune"] == (
        "n_trials × seeds × tune settings = 100 × 3 × 100 = 30000 training runs, "
        "over the limit of 20000 per job"
    )
    assert check_job(spec, get_settings(max_job_runs=30_000))  # at the limit: accepted
    plain = spec_with(("n_trials", 400), ("seeds", 5))
    errors = _refused(plain, max_trials=1000, max_job_runs=1000)
    assert errors["n_trials"] == (
        "n_trials × seeds = 400 × 5 = 2000 training runs, over the limit of 1000 per job"
    )


def test_the_job_s_compute_counts_the_tune_settings() -> None:
    # 1000 trials × 1 seed × 1e21 FLOPs = 1e24: at the limit; two tune settings: over it
    at_limit = spec_with(("n_trials", 1000), ("budget", {"flops": 1e21}))
    check_job(at_limit, get_settings(max_budget_flops=1e21))
    over = spec_with(
        ("n_trials", 1000), ("budget", {"flops": 1e21}), ("tune", {"lr": [1e-3, 3e-3]})
    )
    reason = _refused(over, max_budget_flops=1e21)["budget"]
    assert "n_trials × seeds × tune settings × 1e+21 FLOPs = 2e+24 FLOPs" in reason


def test_the_values_of_a_training_axis_are_bounded() -> None:
    many = [1e-4 * (i + 1) for i in range(12)]
    errors = _refused(spec_with(("training.lr", many)), max_axis_values=10)
    assert errors["training.lr"] == "12 values, over the limit of 10 per axis"
    errors = _refused(spec_with(("tune", {"weight_decay": many})), max_axis_values=10)
    assert errors["tune.weight_decay"] == "12 values, over the limit of 10 per axis"


# -- the study's parameters ---------------------------------------------------------------------
JOINT = (
    ("training.lr", LOG_LR),
    ("training.warmup_frac", [0.0, 0.1]),
    ("training.weight_decay", {"low": 0.0, "high": 0.2}),
)


def test_joint_axes_are_study_parameters_after_the_architecture_s() -> None:
    spec = spec_with(*JOINT, ("budget", {"flops": [1e12, 2e12]}))
    names = [a.name for a in CandidateSpace(spec).study_axes()]
    assert names == [
        "residual",
        "n_layers",
        "d_model",
        "budget",
        "lr",
        "warmup_frac",
        "weight_decay",
    ]
    # the candidates (the architectures) are unchanged by them
    assert CandidateSpace(spec).size() == CandidateSpace(parse_spec(GOOD)).size()


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_every_sampler_samples_the_joint_axes(sampler: str) -> None:
    spec = spec_with(*JOINT, ("sampler", sampler))
    study = optuna.create_study(sampler=make_sampler(spec))
    for _ in range(30):
        trial = study.ask()
        params = suggest(trial, spec)
        assert 1e-4 <= params["lr"] <= 1e-1
        assert params["warmup_frac"] in (0.0, 0.1)
        assert 0.0 <= params["weight_decay"] <= 0.2
        assert trial.params == params  # recorded by the study under their own names
        study.tell(trial, float(params["lr"]))
    lr = study.trials[0].distributions["lr"]
    assert isinstance(lr, optuna.distributions.FloatDistribution) and lr.log
    wd = study.trials[0].distributions["weight_decay"]
    assert isinstance(wd, optuna.distributions.FloatDistribution) and not wd.log
    assert isinstance(
        study.trials[0].distributions["warmup_frac"], optuna.distributions.CategoricalDistribution
    )


def test_a_log_range_is_sampled_uniformly_in_log_space() -> None:
    spec = spec_with(*JOINT, ("sampler", "random"))
    study = optuna.create_study(sampler=make_sampler(spec))
    lrs, wds = [], []
    for _ in range(1500):
        trial = study.ask()
        params = suggest(trial, spec)
        lrs.append(params["lr"])
        wds.append(params["weight_decay"])
        study.tell(trial, 0.0)
    # each decade of [1e-4, 1e-1] holds about a third (a linear range would put 90 % in the last)
    for k in range(3):
        share = sum(10 ** (-4 + k) <= v < 10 ** (-3 + k) for v in lrs) / len(lrs)
        assert abs(share - 1 / 3) < 0.05, (k, share)
    # the linear range: half below its midpoint
    assert abs(sum(v < 0.1 for v in wds) / len(wds) - 0.5) < 0.05


def test_the_grid_holds_the_joint_choices() -> None:
    spec = spec_with(
        ("sampler", "grid"),
        ("training.lr", [1e-3, 3e-3]),
        ("training.depth_lr_mult", [0.5, 2.0]),
        ("space.n_layers", [2]),
        ("space.d_model", [64]),
        ("space.variants", ["full_attnres"]),
        ("space.block_sizes", None),
    )
    grid = grid_space(spec)
    assert grid == {
        "residual": ["full_attnres"],
        "n_layers": [2],
        "d_model": [64],
        "lr": [1e-3, 3e-3],
        "depth_lr_mult": [0.5, 2.0],
    }
    study = optuna.create_study(sampler=make_sampler(spec))
    seen = set()
    for _ in range(4):
        trial = study.ask()
        params = suggest(trial, spec)
        seen.add((params["lr"], params["depth_lr_mult"]))
        study.tell(trial, 0.0)
    assert seen == {(a, b) for a in (1e-3, 3e-3) for b in (0.5, 2.0)}


def test_a_range_has_no_grid() -> None:
    spec = spec_with(("training.lr", LOG_LR))
    with pytest.raises(ValueError, match=r"training\.lr: a continuous range"):
        grid_space(spec)


def test_the_architecture_ignores_the_training_axes() -> None:
    spec = spec_with(*JOINT)
    params = {"residual": "block_attnres/S=2", "n_layers": 4, "d_model": 64}
    joint = params | {"lr": 3e-3, "warmup_frac": 0.1, "weight_decay": 0.05}
    assert CandidateSpace.from_study(joint) == CandidateSpace.from_study(params)
    assert build_candidate(spec, CandidateSpace.from_study(joint)).arch == (
        build_candidate(spec, CandidateSpace.from_study(params)).arch
    )


# -- a trial's settings -------------------------------------------------------------------------
ARCH = {"residual": "block_attnres/S=2", "n_layers": 4, "d_model": 64}


def test_training_setting_fixed_and_joint() -> None:
    fixed = spec_with(("training.lr", 1e-3), ("training.depth_lr_mult", 2.0))
    assert training_setting(fixed, ARCH) == {
        "lr": 1e-3,
        "depth_lr_mult": 2.0,
        "warmup_frac": 0.05,
        "weight_decay": 0.1,
    }
    joint = spec_with(*JOINT)
    got = training_setting(joint, ARCH | {"lr": 0.02, "warmup_frac": 0.1, "weight_decay": 0.15})
    assert got == {"lr": 0.02, "depth_lr_mult": 1.0, "warmup_frac": 0.1, "weight_decay": 0.15}
    assert list(got) == list(TRAINING_AXES)
    assert all(type(v) is float for v in got.values())
    with pytest.raises(ValueError, match="'lr'"):
        training_setting(joint, ARCH | {"warmup_frac": 0.1, "weight_decay": 0.15})


def test_tune_settings_are_the_product_in_axis_order() -> None:
    spec = spec_with(
        ("tune", {"weight_decay": [0.0, 0.1], "lr": [1e-3, 3e-3, 1e-2]}),  # given out of order
        ("training.warmup_frac", [0.0, 0.2]),  # joint: from the trial
        ("training.depth_lr_mult", 0.5),  # fixed
    )
    settings = tune_settings(spec, ARCH | {"warmup_frac": 0.2})
    expected = [
        {"lr": lr, "depth_lr_mult": 0.5, "warmup_frac": 0.2, "weight_decay": wd}
        for lr in (1e-3, 3e-3, 1e-2)  # lr before weight_decay, as in TRAINING_AXES
        for wd in (0.0, 0.1)
    ]
    assert settings == expected
    assert all(list(s) == list(TRAINING_AXES) for s in settings)
    assert len(settings) == spec.tune_size == runs_per_trial(spec)
    # without tune: the trial's one setting
    assert tune_settings(parse_spec(GOOD), ARCH) == [training_setting(parse_spec(GOOD), ARCH)]


def test_a_variant_without_depth_mixing_trains_one_depth_lr_mult() -> None:
    spec = spec_with(("tune", {"lr": [1e-3, 1e-2], "depth_lr_mult": [0.1, 1.0, 10.0]}))
    mixed = tune_settings(spec, ARCH)
    assert len(mixed) == 6 == runs_per_trial(spec) // spec.seeds
    assert {s["depth_lr_mult"] for s in mixed} == {0.1, 1.0, 10.0}
    plain = tune_settings(spec, ARCH | {"residual": "baseline"})
    assert [(s["lr"], s["depth_lr_mult"]) for s in plain] == [(1e-3, 1.0), (1e-2, 1.0)]


def test_the_train_spec_carries_the_trial_s_setting() -> None:
    spec = spec_with(*JOINT, ("training.depth_lr_mult", 4.0), ("tune", None))
    params = ARCH | {"lr": 0.02, "warmup_frac": 0.1, "weight_decay": 0.15}
    priced = price_candidate(spec, params, seed=3)
    ts = priced.train_spec
    assert ts is not None
    assert (ts.lr, ts.depth_lr_mult, ts.warmup_frac, ts.weight_decay) == (0.02, 4.0, 0.1, 0.15)
    assert ts.seed == 3
    # the runner's runs: another setting and seed of the same priced candidate
    tuned = spec_with(("tune", {"lr": [1e-3, 1e-2]}))
    priced = price_candidate(tuned, ARCH)
    assert priced.train_spec is not None
    for k, setting in enumerate(tune_settings(tuned, ARCH)):
        run = priced.train_spec.replace(**setting, seed=k)
        assert (run.lr, run.seed) == (setting["lr"], k)
        assert run.arch == priced.train_spec.arch


def test_the_costs_are_computed_once_per_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[ArchConfig] = []

    def counted(arch: ArchConfig, *args: Any) -> Any:
        calls.append(arch)
        return price(arch, *args)

    monkeypatch.setattr(search, "price", counted)
    search._cost_metrics.cache_clear()
    spec = spec_with(*JOINT)
    first = price_candidate(spec, ARCH | {"lr": 1e-3, "warmup_frac": 0.0, "weight_decay": 0.0})
    second = price_candidate(spec, ARCH | {"lr": 2e-2, "warmup_frac": 0.1, "weight_decay": 0.2})
    assert len(calls) == 1
    assert first.metrics == second.metrics
    assert first.train_spec is not None and second.train_spec is not None
    assert (first.train_spec.lr, second.train_spec.lr) == (1e-3, 2e-2)
    # the metrics are the cost model's own
    context = spec.cost.workload(spec.training), spec.cost.parallelism()
    report = price(calls[0], *context, get_hardware(spec.cost.hardware))
    assert first.metrics == {k: float(v) for k, v in report.metrics().items()}
    # another architecture, or another cost context, is priced again
    setting = {"lr": 1e-3, "warmup_frac": 0.0, "weight_decay": 0.0}
    price_candidate(spec, ARCH | {"n_layers": 2} | setting)
    assert len(calls) == 2
    other = spec.model_copy(update={"cost": spec.cost.model_copy(update={"hardware": "a100"})})
    price_candidate(other, ARCH | setting)
    assert len(calls) == 3
    assert search._cost_metrics.cache_info().maxsize == search.COST_CACHE_SIZE


def test_a_job_with_training_axes_is_submitted_over_http_and_read_back(
    client: TestClient,
) -> None:
    """The API validates strictly (a JSON integer is a float here too); the stored spec reads
    back as the one submitted."""
    body = with_(
        ("training.lr", {"low": 1, "high": 3, "log": True}),  # JSON integers
        ("training.warmup_frac", [0, 0.1]),
        ("tune", {"depth_lr_mult": [0.1, 1, 10], "weight_decay": [0, 0.1]}),
        ("seeds", 2),
    )
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert JobSpec.model_validate(job["spec"]) == parse_spec(body)
    read = client.get(f"/v1/jobs/{job['id']}").json()
    spec = JobSpec.model_validate(read["spec"])
    assert spec.training.lr == FloatRange(low=1.0, high=3.0, log=True)
    assert spec.tune is not None and spec.tune.axes() == {
        "depth_lr_mult": [0.1, 1.0, 10.0],
        "weight_decay": [0.0, 0.1],
    }
    assert runs_per_trial(spec) == 2 * 6
