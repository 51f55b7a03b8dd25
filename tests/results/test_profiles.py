"""Profiles over training settings, the fixed-setting view, sensitivity and paired comparisons,
on synthetic trials whose truth is known (`nas_service.results.profiles`, and the optimum,
Pareto and scaling queries of `nas_service.results.answers` that read them)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
import pytest

from nas_service.results import comparison, profiles
from nas_service.results.answers import (
    JobResults,
    TrialRow,
    _row,
    optimum_by_variant,
    pareto_rows,
    scaling_by_variant,
)
from nas_service.store import TrialStatus
from nas_service.store.records import SettingRecord

BUDGET = 1e15
#: (d_model, n_layers) at d_model/L_b = 4, 8, …, 256
SHAPES = [(64, 16), (96, 12), (128, 8), (192, 6), (256, 4), (384, 3), (512, 2)]


def setting(lr: float, depth_lr_mult: float = 1.0) -> dict[str, float]:
    return {"lr": lr, "depth_lr_mult": depth_lr_mult, "warmup_frac": 0.05, "weight_decay": 0.1}


def arch(
    variant: str, n_layers: int, d_model: int, n_heads: int = 4, block_size: int | None = None
) -> dict[str, Any]:
    return {
        "variant": variant,
        "n_layers": n_layers,
        "d_model": d_model,
        "n_heads": n_heads,
        "block_size": block_size,
        "mlp": "gelu",
    }


def make_row(
    number: int,
    architecture: dict[str, Any],
    runs: Sequence[tuple[dict[str, float], Sequence[float | None]]],
    budget: float | None = BUDGET,
) -> TrialRow:
    """A completed trial as the runner records it: every setting with its per-seed losses,
    the chosen one the best by mean (its mean the trial's val_loss)."""
    settings: list[SettingRecord] = []
    best: tuple[float, dict[str, float], list[float | None]] | None = None
    for s, losses in runs:
        finite = all(v is not None and math.isfinite(v) for v in losses)
        mean = float(np.mean(np.asarray(losses, dtype=float))) if finite else None
        settings.append({"setting": dict(s), "losses": list(losses), "mean": mean})
        if mean is not None and (best is None or mean < best[0]):
            best = (mean, dict(s), list(losses))
    assert best is not None
    loss, chosen, seeds = best
    row = old_row(number, architecture, loss, budget)
    row.setting, row.settings, row.seeds = chosen, settings, seeds
    return row


def old_row(
    number: int, architecture: dict[str, Any], loss: float, budget: float | None = BUDGET
) -> TrialRow:
    """A trial from before settings were recorded (no setting, settings or seeds)."""
    return TrialRow(
        number,
        TrialStatus.COMPLETE,
        "completed",
        "",
        {},
        dict(architecture),
        {"val_loss": loss, "params_total": 1e6},
        [loss],
        [],
        [],
        False,
        1.0,
        budget,
    )


# -- a landscape in which each shape's best learning rate differs ---------------------------


TRUE_RATIO = 8.0


def lr_star(d_model: int) -> float:
    return 1e-3 * d_model / 64  # wider shapes prefer a larger learning rate


def bowl(d_model: int, n_layers: int) -> float:
    return 2.0 + 0.05 * (math.log(d_model / n_layers) - math.log(TRUE_RATIO)) ** 2


def landscape(d_model: int, n_layers: int, lr: float) -> float:
    """A bowl in ln(d_model/L_b) with its minimum at TRUE_RATIO, plus the shape's penalty for
    a learning rate away from its own best."""
    return bowl(d_model, n_layers) + 0.4 * (math.log(lr) - math.log(lr_star(d_model))) ** 2


LRS = sorted({lr_star(d) for d, _ in SHAPES})


def landscape_rows(
    seeds: int = 3, noise: float = 0.002, joint: bool = True, seed: int = 0
) -> list[TrialRow]:
    """Every shape at every lr of LRS: one trial per (shape, lr) (joint axes) or one trial per
    shape trained at each lr (a per-shape grid)."""
    rng = np.random.default_rng(seed)
    rows: list[TrialRow] = []
    for d, n_layers in SHAPES:
        runs = [
            (setting(lr), list(landscape(d, n_layers, lr) + rng.normal(0, noise, seeds)))
            for lr in LRS
        ]
        if joint:
            for run in runs:
                rows.append(make_row(len(rows), arch("baseline", n_layers, d), [run]))
        else:
            rows.append(make_row(len(rows), arch("baseline", n_layers, d), runs))
    return rows


def test_profile_takes_each_architectures_best_setting_across_trials() -> None:
    rows = landscape_rows(noise=0.0)
    prof = profiles.profile(rows)
    assert len(prof) == len(SHAPES)
    for p in prof:
        d = p.row.arch["d_model"]
        assert p.setting["lr"] == pytest.approx(lr_star(d))
        assert p.loss == pytest.approx(landscape(d, p.row.arch["n_layers"], lr_star(d)))
        assert p.n_settings == len(LRS) and p.n_trials == len(LRS)
        assert p.row.setting == p.setting  # the trial that trained it there
    grid = profiles.profile(landscape_rows(noise=0.0, joint=False))
    assert [(p.setting, p.loss) for p in grid] == [(p.setting, p.loss) for p in prof]
    assert all(p.n_trials == 1 and p.n_settings == len(LRS) for p in grid)


def test_fixed_view_is_the_best_single_setting() -> None:
    rows = landscape_rows(noise=0.0)
    shared, fixed = profiles.fixed_view(rows)
    medians = {lr: float(np.median([landscape(d, n, lr) for d, n in SHAPES])) for lr in LRS}
    assert shared["lr"] == min(medians, key=lambda lr: medians[lr])
    assert len(fixed) == len(SHAPES)
    assert all(p.setting == shared for p in fixed)
    # a setting tried on fewer architectures is not a candidate, however good
    extra = make_row(99, arch("baseline", 6, 192), [(setting(0.5), [1.0, 1.0, 1.0])])
    assert profiles.fixed_view([*rows, extra])[0] == shared


def test_the_profiled_optimum_recovers_the_truth_and_the_fixed_view_does_not() -> None:
    rows = landscape_rows(seeds=3, noise=0.002)
    results = JobResults("s", ["val_loss"], rows)
    (fit,) = optimum_by_variant(results, bootstrap=400)
    assert fit["view"] == "profile"
    assert fit["verdict"] == "ok"
    assert fit["optimum_ratio"] == pytest.approx(TRUE_RATIO, rel=0.1)
    assert fit["ci_low"] < TRUE_RATIO < fit["ci_high"]
    assert fit["n_trials"] == len(SHAPES)  # one point per architecture
    fixed = fit["fixed"]
    assert fixed["setting"]["lr"] in LRS
    assert fixed["optimum_ratio"] is not None
    assert abs(math.log(fixed["optimum_ratio"] / TRUE_RATIO)) > math.log(1.3)
    assert fixed["ci_high"] is not None and fixed["ci_low"] is not None
    assert not fixed["ci_low"] <= TRUE_RATIO <= fixed["ci_high"]
    assert fit["moved"] is True
    direction = "smaller" if fit["optimum_ratio"] < fixed["optimum_ratio"] else "larger"
    assert "moves from" in fit["move_message"] and direction in fit["move_message"]
    # the raw view fits every trial, its own setting each
    (raw,) = optimum_by_variant(results, bootstrap=100, profile=False)
    assert raw["view"] == "raw" and raw["n_trials"] == len(rows)


def test_the_optimum_does_not_move_when_every_shape_prefers_the_same_setting() -> None:
    rng = np.random.default_rng(1)
    rows: list[TrialRow] = []
    for d, n_layers in SHAPES:
        runs = [
            (
                setting(lr),
                list(bowl(d, n_layers) + 0.05 * math.log(lr / 3e-3) ** 2 + rng.normal(0, 0.002, 3)),
            )
            for lr in (1e-3, 3e-3, 1e-2)
        ]
        rows.append(make_row(len(rows), arch("baseline", n_layers, d), runs))
    (fit,) = optimum_by_variant(JobResults("s", ["val_loss"], rows), bootstrap=400)
    assert fit["fixed"]["setting"]["lr"] == 3e-3
    assert fit["moved"] is False and "does not move" in fit["move_message"]


# -- sensitivity ----------------------------------------------------------------------------


def test_sensitivity_curves_per_shape_and_edge_flags() -> None:
    """lr* grows with d_model; the grid stops at 4e-3, so the four widest shapes (lr* 4e-3
    and beyond) have their best at the largest lr tried, the narrowest at the smallest."""
    grid = [1e-3, 2e-3, 4e-3]
    shapes = [(64, 16), (128, 8), (192, 6), (256, 4), (384, 3), (512, 2)]
    rows: list[TrialRow] = []
    for d, n_layers in shapes:
        runs = [(setting(lr), [landscape(d, n_layers, lr)] * 2) for lr in grid]
        runs.append((setting(grid[1], 10.0), [landscape(d, n_layers, grid[1]) + 0.01] * 2))
        rows.append(make_row(len(rows), arch("baseline", n_layers, d), runs))
    out = comparison.sensitivity(rows)
    (v,) = out["variants"]
    assert v["variant"] == "baseline"
    axes = {a["axis"]: a for a in v["axes"]}
    assert set(axes) == {"lr", "depth_lr_mult"}  # warmup and weight decay took one value
    lr = axes["lr"]
    assert lr["values"] == grid
    assert len(lr["curves"]) == len(shapes)
    by_depth = sorted(shapes, key=lambda s: s[1])  # curves by budget, n_layers, d_model
    for curve, (d, n_layers) in zip(lr["curves"], by_depth, strict=True):
        assert (curve["d_model"], curve["n_layers"], curve["budget"]) == (d, n_layers, BUDGET)
        assert [p[0] for p in curve["points"]] == grid
        assert [p[1] for p in curve["points"]] == pytest.approx(
            [landscape(d, n_layers, g) for g in grid]
        )  # the best over the other axes (depth_lr_mult 10 is worse)
        best = min(grid, key=lambda g: landscape(d, n_layers, g))
        assert curve["best"] == best
        assert curve["at_edge"] == ("high" if best == 4e-3 else "low" if best == 1e-3 else None)
    highs = [c for c in lr["curves"] if c["at_edge"] == "high"]
    assert len(highs) == 4
    assert (
        "widen lr: the best lr of 4 of 6 shapes lies at the largest value tried (0.004)"
        in v["flags"]
    )
    assert (
        "widen lr: the best lr of 1 of 6 shapes lies at the smallest value tried (0.001)"
        in v["flags"]
    )
    assert [b["best_lr"] for b in v["best_lr"]] == [c["best"] for c in lr["curves"]]
    # depth_lr_mult: 1 beats 10 everywhere, the smallest tried
    assert all(c["at_edge"] == "low" for c in axes["depth_lr_mult"]["curves"])


def test_the_best_lr_fit_recovers_its_exponents_where_identifiable() -> None:
    """lr* = 0.003 (d/128)^0.5 (L/4)^−0.3 on shapes whose d_model and n_layers vary
    independently: a = 0.5, b = −0.3; on shapes with d_model² L fixed, only their combined
    slope, and the fit says so."""

    def star(d: int, n_layers: int) -> float:
        return float(0.003 * (d / 128) ** 0.5 * (n_layers / 4) ** -0.3)

    def rows_for(shapes: list[tuple[int, int]]) -> list[TrialRow]:
        rows: list[TrialRow] = []
        for d, n_layers in shapes:
            best = star(d, n_layers)
            runs = [
                (setting(best * f), [2.0 + 0.4 * math.log(f) ** 2] * 2) for f in (0.5, 1.0, 2.0)
            ]
            rows.append(make_row(len(rows), arch("baseline", n_layers, d), runs))
        return rows

    free = [(64, 2), (64, 8), (128, 4), (256, 2), (256, 8), (512, 4)]
    (v,) = comparison.sensitivity(rows_for(free))["variants"]
    fit = v["best_lr_fit"]
    assert fit["a"] == pytest.approx(0.5, abs=1e-9) and fit["b"] == pytest.approx(-0.3, abs=1e-9)
    assert fit["c"] == pytest.approx(math.log(0.003 * 128**-0.5 * 4**0.3), abs=1e-9)
    assert fit["n_shapes"] == 6 and fit["rms_residual"] == pytest.approx(0.0, abs=1e-9)
    tied = [(64, 16), (128, 4), (256, 1)]  # d² L = 65536
    (v,) = comparison.sensitivity(rows_for(tied))["variants"]
    fit = v["best_lr_fit"]
    assert fit["b"] is None and "not separately identifiable" in fit["message"]
    assert fit["a"] == pytest.approx(0.5 + 0.6, abs=1e-9)  # ln L = const − 2 ln d
    # the widths of a real fixed-parameter sweep, rounded to the head dimension: nearly on
    # one line, so a two-term fit would give exponents that mean nothing
    rounded = [(104, 1), (72, 2), (64, 3), (56, 4), (48, 5), (40, 8)]
    (v,) = comparison.sensitivity(rows_for(rounded))["variants"]
    fit = v["best_lr_fit"]
    assert fit["b"] is None and "not separately identifiable" in fit["message"]
    (v,) = comparison.sensitivity(rows_for(tied[:2]))["variants"]
    assert v["best_lr_fit"] is None  # fewer than three shapes


# -- paired comparisons -----------------------------------------------------------------------


def paired_rows(
    effects: Callable[[int], float],
    depths: Sequence[int],
    seeds: int,
    noise: float,
    seed_sd: float = 0.05,
    rng_seed: int = 0,
    variant: str = "block_attnres",
    block_size: int | None = 4,
) -> list[TrialRow]:
    """The reference and `variant` at each depth (d_model 64·depth, one shape per depth):
    per seed a shared effect (seed k sees the same batches in both, sd `seed_sd`) plus each
    run's own noise; the variant's loss is higher by `effects(depth)`."""
    rng = np.random.default_rng(rng_seed)
    rows: list[TrialRow] = []
    for depth in depths:
        shared = 2.0 + rng.normal(0, seed_sd, seeds)
        ref = shared + rng.normal(0, noise, seeds)
        var = shared + effects(depth) + rng.normal(0, noise, seeds)
        s = setting(3e-3)
        rows.append(make_row(len(rows), arch("baseline", depth, 64 * depth), [(s, list(ref))]))
        rows.append(
            make_row(
                len(rows), arch(variant, depth, 64 * depth, block_size=block_size), [(s, list(var))]
            )
        )
    return rows


def test_paired_intervals_cover_a_known_effect_at_the_stated_rate() -> None:
    """2,000 matched shapes, each an independent draw of 4 paired seeds with a true effect of
    −0.01: the 95% interval holds −0.01 in 93–97% of them."""
    effect = -0.01
    rows = paired_rows(lambda d: effect, range(1, 2001), seeds=4, noise=0.01)
    out = comparison.compare(rows, "baseline")
    assert out["method"] == "paired Student t over seeds, n-1 degrees of freedom"
    assert out["reference"] == "baseline" and out["level"] == 0.95
    pairs = out["pairs"]
    assert len(pairs) == 2000 and not out["unmatched"]
    assert {p["variant"] for p in pairs} == {"block_attnres/S=4"}
    covered = np.mean([p["ci_low"] <= effect <= p["ci_high"] for p in pairs])
    assert 0.93 <= covered <= 0.97
    p = pairs[0]
    assert p["seeds"] == [0, 1, 2, 3] and len(p["differences"]) == 4
    assert p["mean"] == pytest.approx(np.mean(p["differences"]))
    assert p["sublayers"] == 2 * p["n_layers"]
    assert p["trial"] == 1 and p["reference_trial"] == 0
    assert p["setting"] == p["reference_setting"] == setting(3e-3)


def test_no_effect_is_no_difference_at_about_the_false_positive_rate() -> None:
    rows = paired_rows(lambda d: 0.0, range(1, 2001), seeds=3, noise=0.01, rng_seed=1)
    verdicts = [p["verdict"] for p in comparison.compare(rows, "baseline")["pairs"]]
    false_positive = 1 - verdicts.count("no_difference") / len(verdicts)
    assert 0.03 <= false_positive <= 0.07


def constant(value: float, depth: int) -> float:
    return value


def test_strong_effects_are_better_or_worse_thanks_to_the_pairing() -> None:
    """An effect of 0.02 is drowned by the seed-to-seed spread (sd 0.05) in an unpaired
    comparison of means, but each seed's difference sees only the runs' own noise."""
    for effect, verdict in ((-0.02, "better"), (0.02, "worse")):
        rows = paired_rows(functools.partial(constant, effect), range(1, 21), seeds=3, noise=0.002)
        pairs = comparison.compare(rows, "baseline")["pairs"]
        assert [p["verdict"] for p in pairs] == [verdict] * 20
    one = paired_rows(lambda d: -0.02, [4], seeds=1, noise=0.002)
    (p,) = comparison.compare(one, "baseline")["pairs"]
    assert p["verdict"] == "undetermined" and p["ci_low"] is None and len(p["differences"]) == 1


def test_only_seeds_both_have_are_paired() -> None:
    s = setting(3e-3)
    rows = [
        make_row(0, arch("baseline", 4, 256), [(s, [2.0, 2.1, 2.2])]),
        make_row(1, arch("denseformer", 4, 256), [(s, [1.9, 2.05])]),
    ]
    (p,) = comparison.compare(rows, "baseline")["pairs"]
    assert p["seeds"] == [0, 1] and p["differences"] == pytest.approx([-0.1, -0.05])
    half = 12.7062 * np.std([-0.1, -0.05], ddof=1) / math.sqrt(2)  # t(0.975, 1)
    assert p["ci_low"] == pytest.approx(-0.075 - half, rel=1e-4)
    assert p["ci_high"] == pytest.approx(-0.075 + half, rel=1e-4)
    assert p["verdict"] == "no_difference"


def test_crossover_at_the_right_depth() -> None:
    depths = [2, 3, 4, 6, 8, 12, 16]
    rows = paired_rows(lambda d: 0.03 if d < 6 else -0.05, depths, seeds=4, noise=0.003)
    out = comparison.compare(rows, "baseline")
    (c,) = out["crossover"]
    assert c["variant"] == "block_attnres/S=4"
    assert c["crossover_depth"] == 6 and c["crossover_sublayers"] == 12
    assert [p["n_layers"] for p in c["by_depth"]] == depths
    assert [p["verdict"] for p in c["by_depth"]] == ["worse"] * 3 + ["better"] * 4
    assert "crossover at n_layers 6 (12 sublayers)" in c["message"]
    # better at 4, not at 6, better from 8 on: the crossover is 8
    rows = paired_rows(
        lambda d: 0.0 if d == 6 else -0.05, depths, seeds=4, noise=0.003, seed_sd=0.0
    )
    rows = [r for r in rows if not (r.arch["n_layers"] == 6 and r.variant != "baseline")]
    rows.append(
        make_row(
            99,
            arch("block_attnres", 6, 384, block_size=4),
            [(setting(3e-3), [2.0, 2.01, 1.99, 2.0])],
        )
    )
    rows = [r for r in rows if not (r.arch["n_layers"] == 6 and r.variant == "baseline")]
    rows.append(make_row(98, arch("baseline", 6, 384), [(setting(3e-3), [2.0, 2.0, 2.0, 2.01])]))
    (c,) = comparison.compare(rows, "baseline")["crossover"]
    assert c["by_depth"][3]["verdict"] == "no_difference"
    assert c["crossover_depth"] == 8
    # better everywhere: the crossover is the shallowest explored depth, and it says so
    rows = paired_rows(lambda d: -0.05, depths, seeds=4, noise=0.003)
    (c,) = comparison.compare(rows, "baseline")["crossover"]
    assert c["crossover_depth"] == 2 and "every depth" in c["message"]


def test_no_crossover_is_a_statement_with_the_explored_range() -> None:
    rows = paired_rows(lambda d: -0.05 if d < 8 else 0.02, [2, 4, 8, 16], seeds=4, noise=0.003)
    (c,) = comparison.compare(rows, "baseline")["crossover"]
    assert c["crossover_depth"] is None and c["crossover_sublayers"] is None
    assert (
        "no crossover found in the explored range [2, 16] n_layers (4-32 sublayers)" in c["message"]
    )


def test_compare_names_its_reference_and_its_unmatched_shapes() -> None:
    rows = paired_rows(lambda d: -0.02, [2, 4], seeds=3, noise=0.002)
    rows.append(
        make_row(10, arch("block_attnres", 8, 512, block_size=4), [(setting(3e-3), [2.0] * 3)])
    )
    rows.append(make_row(11, arch("baseline", 16, 512), [(setting(3e-3), [2.0] * 3)]))
    out = comparison.compare(rows, "baseline")
    assert [(u["variant"], u["n_layers"]) for u in out["unmatched"]] == [
        ("block_attnres/S=4", 8),
        ("baseline", 16),
    ]
    against = comparison.compare(rows, "block_attnres")  # the job's only block size
    assert against["reference"] == "block_attnres/S=4"
    assert [p["variant"] for p in against["pairs"]] == ["baseline", "baseline"]
    assert against["pairs"][0]["mean"] == pytest.approx(-out["pairs"][0]["mean"])
    with pytest.raises(ValueError, match="'mhc_lite' has no trained trial"):
        comparison.compare(rows, "mhc_lite")
    with pytest.raises(ValueError, match="no trained trial"):
        comparison.compare([], "baseline")


def test_each_variant_is_compared_at_its_own_best_setting() -> None:
    """The variant is best at a 10× depth_lr_mult, the reference at 1×: each pair uses each
    side's best."""
    s1, s10 = setting(3e-3, 1.0), setting(3e-3, 10.0)
    rows = [
        make_row(0, arch("baseline", 4, 256), [(s1, [2.0, 2.1]), (s10, [2.5, 2.6])]),
        make_row(1, arch("full_attnres", 4, 256), [(s1, [2.2, 2.3])]),
        make_row(2, arch("full_attnres", 4, 256), [(s10, [1.9, 2.05])]),  # joint: another trial
    ]
    (p,) = comparison.compare(rows, "baseline")["pairs"]
    assert p["setting"] == s10 and p["reference_setting"] == s1
    assert p["trial"] == 2 and p["differences"] == pytest.approx([-0.1, -0.05])


# -- trials from before settings were recorded -----------------------------------------------


def test_old_rows_work_in_every_function() -> None:
    shapes = [(64, 16), (128, 8), (256, 4), (512, 2)]
    rows = [old_row(i, arch("baseline", n, d), bowl(d, n)) for i, (d, n) in enumerate(shapes)]
    rows += [
        old_row(10 + i, arch("denseformer", n, d), bowl(d, n) - 0.01)
        for i, (d, n) in enumerate(shapes)
    ]
    r = rows[0]
    assert r.setting == {} and r.seeds == [r.metrics["val_loss"]]
    assert r.settings == [
        {"setting": {}, "losses": [r.metrics["val_loss"]], "mean": r.metrics["val_loss"]}
    ]
    assert r.as_dict()["settings"] == r.settings and r.as_dict()["seeds"] == r.seeds
    prof = profiles.profile(rows)
    assert len(prof) == 8 and all(p.setting == {} and p.n_settings == 1 for p in prof)
    assert profiles.fixed_view(rows)[0] == {} and len(profiles.fixed_view(rows)[1]) == 8
    assert comparison.sensitivity(rows) == {
        "variants": [
            {"variant": v, "axes": [], "best_lr": [], "best_lr_fit": None, "flags": []}
            for v in ("baseline", "denseformer")
        ]
    }
    out = comparison.compare(rows, "baseline")
    assert [p["verdict"] for p in out["pairs"]] == ["undetermined"] * 4  # one seed each
    assert out["pairs"][0]["differences"] == pytest.approx([-0.01])
    results = JobResults("s", ["val_loss"], rows)
    fits = optimum_by_variant(results, bootstrap=100)
    assert [f["variant"] for f in fits] == ["baseline", "denseformer"]
    assert all("fixed" not in f and f["view"] == "profile" for f in fits)
    assert fits[0]["optimum_ratio"] == pytest.approx(TRUE_RATIO, rel=1e-6)
    front, candidates = pareto_rows(results, ["val_loss", "params_total"], profile=True)
    assert len(candidates) == 8  # ratios 4 and 16 tie (the bowl is symmetric about 8)
    assert [(r.variant, r.arch["d_model"]) for r in front] == [
        ("denseformer", 64),
        ("denseformer", 128),
    ]
    assert scaling_by_variant(results)["problems"]  # one budget: no scaling fit, no error


def test_trial_rows_read_from_optuna_trials_old_and_new() -> None:
    a = arch("baseline", 4, 256)
    old = optuna.trial.create_trial(
        value=2.05,
        user_attrs={"arch": a, "val_loss_seeds": {"mean": 2.05, "values": [2.0, 2.1]}},
    )
    row = _row(old, ["val_loss"], BUDGET)
    assert row.setting == {} and row.seeds == [2.0, 2.1]
    assert row.settings == [{"setting": {}, "losses": [2.0, 2.1], "mean": pytest.approx(2.05)}]
    s1, s2 = setting(1e-3), setting(3e-3)
    new = optuna.trial.create_trial(
        value=1.95,
        user_attrs={
            "arch": a,
            "setting": s2,
            "settings": [
                {"setting": s1, "losses": [2.0, None], "mean": None},
                {"setting": s2, "losses": [1.9, 2.0], "mean": 1.95},
            ],
            "val_loss_seeds": {"mean": 1.95, "values": [1.9, 2.0]},
        },
    )
    row = _row(new, ["val_loss"], BUDGET)
    assert row.setting == s2 and row.seeds == [1.9, 2.0]
    assert row.settings[0]["losses"] == [2.0, None] and row.settings[0]["mean"] is None
    assert [r.setting for r in profiles.records([row])] == [s2]  # the diverged setting: none
    running = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING,
        user_attrs={
            "arch": a,
            "train": [
                {"final_val_loss": 2.2, "seed": 0, "setting": s1},
                {"final_val_loss": 2.3, "seed": 1, "setting": s1},
                {"final_val_loss": 2.1, "seed": 0, "setting": s2},
            ],
        },
    )
    row = _row(running, ["val_loss"], BUDGET)
    assert row.seeds == [2.2, 2.3] and row.settings == [] and not profiles.records([row])


def test_shape_and_architecture_keys() -> None:
    block = make_row(0, arch("block_attnres", 4, 256, block_size=2), [(setting(1e-3), [2.0])])
    assert block.shape_key == ("block_attnres/S=2", 4, 256, 4, BUDGET)
    assert block.residual == "block_attnres/S=2"
    other = make_row(1, arch("block_attnres", 4, 256, block_size=2), [(setting(3e-3), [2.1])])
    assert other.arch_key == block.arch_key  # the same architecture, another setting
    wider = make_row(2, arch("block_attnres", 4, 256, block_size=4), [(setting(1e-3), [2.0])])
    assert wider.arch_key != block.arch_key
    later = make_row(3, arch("block_attnres", 4, 256, block_size=2), [(setting(1e-3), [2.0])], 2e15)
    assert later.arch_key != block.arch_key
    assert old_row(4, {}, 2.0).arch_key != old_row(5, {}, 2.0).arch_key  # no arch: its own


def test_an_optimum_beyond_one_block_says_what_would_locate_it() -> None:
    """Loss rising with depth from one block on: the fit's minimum lies above the widest shape,
    which cannot be widened at this parameter count; the answer says so instead of only
    "widen the space". With the minimum inside the range, no such sentence."""
    shapes = [(104, 1), (72, 2), (64, 3), (56, 4), (48, 5), (40, 8)]
    top = math.log(104) + 2  # the bowl's minimum, above the widest shape's d_model/L_b

    def loss(d: int, n: int) -> float:
        return 1.8 + 0.02 * (math.log(d / n) - top) ** 2

    rising = [
        make_row(i, arch("baseline", n, d), [(setting(3e-3), [loss(d, n)])])
        for i, (d, n) in enumerate(shapes)
    ]
    [fit] = optimum_by_variant(JobResults("s", ["val_loss"], rising), bootstrap=0)
    assert fit["verdict"] == "at_edge"
    assert "one block (L_b = 1, d_model = 104)" in fit["message"]
    assert "larger parameter target" in fit["message"]
    assert "widen the space" not in fit["message"]  # there is no wider shape to add
    wide = [(d * 4, n) for d, n in SHAPES]  # the same bowl, its minimum inside the range
    inside = [
        make_row(i, arch("baseline", n, d), [(setting(3e-3), [2 + math.log(d / n / 40) ** 2])])
        for i, (d, n) in enumerate(wide)
    ]
    [fit] = optimum_by_variant(JobResults("s", ["val_loss"], inside), bootstrap=0)
    assert fit["verdict"] == "ok" and "one block" not in fit["message"]


def test_every_query_reads_the_one_profile_of_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile is computed once per state of the job and shared: the optimum (per
    variant and budget), Pareto, scaling and the paired comparison each filter the job's
    one profile, and each answer equals the profile of its own subset computed afresh."""
    from nas_service.results import queries
    from nas_service.results.answers import _points

    rows = landscape_rows(seeds=2)
    rows += paired_rows(lambda depth: -0.01, [2, 4, 8], seeds=2, noise=0.001)
    for r in paired_rows(lambda depth: 0.02, [2, 4], seeds=2, noise=0.001, rng_seed=1):
        rows.append(make_row(len(rows), r.arch, [(r.setting, r.seeds)], budget=2 * BUDGET))
    pruned = old_row(len(rows), rows[0].arch, 9.0)  # an architecture trained elsewhere too
    pruned.state = TrialStatus.PRUNED
    rows.append(pruned)
    for i, r in enumerate(rows):
        r.number = i
    results = JobResults("s", ["val_loss", "params_total"], rows)

    calls = 0
    original = profiles.profile

    def counted(rows: Any) -> list[profiles.ProfileRow]:
        nonlocal calls
        calls += 1
        return original(rows)

    monkeypatch.setattr(profiles, "profile", counted)
    optimum = optimum_by_variant(results, bootstrap=20)
    pareto_rows(results, ["val_loss", "params_total"], profile=True)
    scaling_by_variant(results)
    compared = queries._comparison(results, "baseline", 0.95)
    assert calls == 1
    monkeypatch.setattr(profiles, "profile", original)

    groups: dict[tuple[str, float | None], list[TrialRow]] = {}
    for r in results.counted():
        if r.state == TrialStatus.COMPLETE:
            groups.setdefault((r.variant, r.budget), []).append(r)
    assert len(groups) == 4 and len(optimum) == 4
    for group in groups.values():
        assert _points(results, group, True) == [
            (p.row, p.loss, p.setting) for p in profiles.profile(group)
        ]
    assert compared == comparison.compare(results.counted(), "baseline", 0.95)
