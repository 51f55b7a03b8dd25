"""The layout search: its space holds exactly the layouts the rules allow, it returns what a
brute-force enumeration over every tuple returns, never a layout the architecture does not
divide, never one over the memory cap, and the grid path agrees with the one-candidate path."""

from __future__ import annotations

import itertools
import math
import random
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_model import (
    RECOMPUTE_MODES,
    VARIANTS,
    ArchConfig,
    ArchConfigError,
    ArchGrid,
    CostInputError,
    Parallelism,
    Variant,
    Workload,
    price,
)
from cost_model.layout import LAYOUT_METRICS, Layout, LayoutSpace, divides, search_layout
from cost_model.layout_grid import best_layouts, search_layout_grid

WL = Workload(seq_len=256)


def _rules_hold(lay: Layout, devices: int, batch: int) -> bool:
    """The architecture-independent rules, written out again."""
    return (
        lay.tensor * lay.pipeline * lay.data == devices
        and lay.data * lay.micro_batch * lay.microbatches == batch
        and (lay.virtual == 1 or (lay.pipeline > 1 and lay.microbatches % lay.pipeline == 0))
        and (not lay.sequence_parallel or lay.tensor > 1)
    )


def _admits(cfg: ArchConfig, lay: Layout, seq_len: int) -> bool:
    """The architecture's divisibility, written out again with plain ints."""
    t = lay.tensor
    return (
        cfg.n_heads % t == 0
        and cfg.kv_heads % t == 0
        and cfg.ffn_dim % t == 0
        and cfg.n_layers % (lay.pipeline * lay.virtual) == 0
        and (not lay.sequence_parallel or seq_len % t == 0)
    )


def _every_tuple(devices: int, batch: int, max_virtual: int) -> list[Layout]:
    """Every (t, p, v, d, b, r, sp) in range, filtered by the rules, in the space's order."""
    out = []
    for t, p, v, d, b in itertools.product(
        range(1, devices + 1),
        range(1, devices + 1),
        range(1, max_virtual + 1),
        range(1, devices + 1),
        range(1, batch + 1),
    ):
        if batch % (d * b):
            continue
        for r, sp in itertools.product(RECOMPUTE_MODES, (False, True)):
            lay = Layout(t, p, v, d, b, batch // (d * b), r, sp)
            if _rules_hold(lay, devices, batch) and (v == 1 or p > 1):
                out.append(lay)
    return out


def _brute_force(
    cfg: ArchConfig, devices: int, batch: int, max_virtual: int, cap: float
) -> tuple[Layout, float, float] | None:
    """The fastest fitting layout by pricing each tuple with `price` (the report's own path),
    ties broken by memory, then by the space's order."""
    rows = []
    for order, lay in enumerate(_every_tuple(devices, batch, max_virtual)):
        if not _admits(cfg, lay, WL.seq_len or cfg.seq_len):
            continue
        wl = WL.replace(
            micro_batch=lay.micro_batch, microbatches=lay.microbatches, recompute=lay.recompute
        )
        par = Parallelism(lay.tensor, lay.pipeline, lay.virtual, lay.data, lay.sequence_parallel)
        report = price(cfg, wl, par, "h100")
        memory = float(report.training_memory.total_bytes)
        if memory <= cap:
            rows.append((float(report.step_time.total_s), memory, order, lay))
    if not rows:
        return None
    time_s, memory, _, lay = min(rows, key=lambda r: r[:3])
    return lay, time_s, memory


SMALL = [
    ArchConfig(n_layers=4, d_model=128, n_heads=4, seq_len=256),
    ArchConfig(n_layers=6, d_model=96, n_heads=6, n_kv_heads=2, mlp="swiglu", seq_len=256),
    ArchConfig(
        n_layers=8, d_model=128, n_heads=8, variant="block_attnres", block_size=4, seq_len=256
    ),
    ArchConfig(n_layers=4, d_model=64, n_heads=2, variant="full_attnres", seq_len=256),
    ArchConfig(n_layers=2, d_model=64, n_heads=4, variant="mhc_lite", seq_len=256),
    ArchConfig(n_layers=3, d_model=64, n_heads=4, variant="denseformer", seq_len=256),
]


def test_the_space_is_exactly_the_layouts_the_rules_allow() -> None:
    for devices, batch, mv in ((8, 16, 3), (12, 6, 2), (1, 4, 4), (6, 1, 2)):
        space = LayoutSpace(devices=devices, global_batch=batch, max_virtual=mv)
        got = space.layouts()
        assert list(got) == _every_tuple(devices, batch, mv)
        assert len(set(got)) == len(got)


@pytest.mark.parametrize("cfg", SMALL, ids=lambda c: f"{c.variant}-{c.n_layers}x{c.d_model}")
@pytest.mark.parametrize("cap", [math.inf, None])
def test_the_search_equals_a_brute_force_enumeration(cfg: ArchConfig, cap: float | None) -> None:
    devices, batch, mv = 8, 16, 3
    space = LayoutSpace(devices=devices, global_batch=batch, max_virtual=mv)
    if cap is None:  # a cap between the smallest and the largest memory: it binds
        every = search_layout(cfg, space, WL, "h100", math.inf, keep=10_000).feasible
        memories = sorted(p.memory_bytes for p in every)
        cap = memories[len(memories) // 3]
    expected = _brute_force(cfg, devices, batch, mv, cap)
    found = search_layout(cfg, space, WL, "h100", cap, keep=10_000)
    assert expected is not None and found.best is not None
    lay, time_s, memory = expected
    assert found.best.layout == lay
    assert found.best.step_time_s == pytest.approx(time_s, rel=1e-12)
    assert found.best.memory_bytes == pytest.approx(memory, rel=1e-12)
    assert found.feasible[0] == found.best
    times = [p.step_time_s for p in found.feasible]
    assert times == sorted(times)
    assert all(p.memory_bytes <= cap for p in found.feasible)
    grid = best_layouts([cfg], space, WL, "h100", cap)
    assert grid.found[0]
    metrics = found.metrics()
    for name in LAYOUT_METRICS:
        assert grid.metrics[name][0] == pytest.approx(metrics[name], rel=1e-12), name


def test_the_grid_path_agrees_with_the_one_candidate_path_on_many_candidates() -> None:
    rng = random.Random(7)
    configs = _random_configs(rng, 40)
    space = LayoutSpace(devices=16, global_batch=32, max_virtual=2)
    cap = 2e8
    grid = best_layouts(configs, space, WL, "a100", cap)
    assert grid.found.any() and not grid.found.all()  # the cap binds for some
    for i, cfg in enumerate(configs):
        one = search_layout(cfg, space, WL, "a100", cap)
        assert bool(grid.found[i]) == (one.best is not None), i
        if one.best is None:
            assert grid.reasons[i] == one.reason
            assert all(np.isnan(grid.metrics[m][i]) for m in LAYOUT_METRICS)
            continue
        for name, value in one.metrics().items():
            assert grid.metrics[name][i] == pytest.approx(value, rel=1e-12), (i, name)


def _random_configs(rng: random.Random, n: int) -> list[ArchConfig]:
    out: list[ArchConfig] = []
    while len(out) < n:
        variant = cast(Variant, rng.choice(VARIANTS))
        heads = rng.choice([1, 2, 3, 4, 6, 8, 12])
        try:
            out.append(
                ArchConfig(
                    n_layers=rng.randint(1, 16),
                    d_model=heads * rng.choice([16, 32]),
                    n_heads=heads,
                    n_kv_heads=rng.choice([None, 1]),
                    mlp=rng.choice(["gelu", "swiglu"]),
                    variant=variant,
                    block_size=rng.randint(1, 4) if variant == "block_attnres" else None,
                    seq_len=rng.choice([128, 256]),
                )
            )
        except ArchConfigError:
            continue
    return out


@settings(max_examples=40, deadline=None)
@given(
    n_layers=st.integers(1, 24),
    heads=st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16]),
    head_dim=st.sampled_from([8, 16]),
    kv_div=st.sampled_from([1, 2, 4]),
    devices=st.sampled_from([1, 2, 4, 6, 8, 12, 16]),
    batch=st.sampled_from([1, 2, 8, 12, 32]),
    seq_len=st.sampled_from([96, 128, 130]),
    cap=st.sampled_from([1e6, 1e7, 1e8, 1e12]),
)
def test_a_returned_layout_is_divisible_and_under_the_cap(
    n_layers: int,
    heads: int,
    head_dim: int,
    kv_div: int,
    devices: int,
    batch: int,
    seq_len: int,
    cap: float,
) -> None:
    kv = heads // kv_div if heads % kv_div == 0 else heads
    cfg = ArchConfig(
        n_layers=n_layers,
        d_model=heads * head_dim,
        n_heads=heads,
        n_kv_heads=kv,
        mlp="swiglu",
        seq_len=seq_len,
    )
    space = LayoutSpace(devices=devices, global_batch=batch, max_virtual=3)
    found = search_layout(cfg, space, None, "h100", cap, keep=10_000)
    grid = search_layout_grid(_as_grid(cfg), space, None, "h100", cap)
    assert bool(grid.found[0]) == (found.best is not None)
    for priced in found.feasible:
        lay = priced.layout
        assert _rules_hold(lay, devices, batch)
        assert _admits(cfg, lay, seq_len)
        assert divides(cfg, lay)
        assert priced.memory_bytes <= cap
    if found.best is None:
        assert found.feasible == () and found.reason
        return
    lay = found.best.layout
    assert cfg.n_heads % lay.tensor == 0 and cfg.kv_heads % lay.tensor == 0
    assert cfg.ffn_dim % lay.tensor == 0
    assert cfg.n_layers % (lay.pipeline * lay.virtual) == 0
    assert batch == lay.data * lay.micro_batch * lay.microbatches
    assert found.best.memory_bytes <= cap
    assert grid.metrics["best_layout_memory_bytes"][0] <= cap
    assert grid.metrics["best_layout_tensor"][0] == lay.tensor
    assert grid.metrics["best_layout_pipeline"][0] * grid.metrics["best_layout_virtual"][0] == (
        lay.pipeline * lay.virtual
    )


def _as_grid(cfg: ArchConfig) -> ArchGrid:
    axes = {
        "n_layers": np.array([cfg.n_layers]),
        "d_model": np.array([cfg.d_model]),
        "n_heads": np.array([cfg.n_heads]),
        "n_kv_heads": np.array([cfg.kv_heads]),
        "d_ff": np.array([cfg.ffn_dim]),
        "seq_len": np.array([cfg.seq_len]),
    }
    return ArchGrid.build(cfg, **axes)


def test_a_tighter_cap_picks_a_slower_layout_that_fits() -> None:
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=8, seq_len=256)
    space = LayoutSpace(devices=8, global_batch=32, max_virtual=2)
    free = search_layout(cfg, space, WL, "h100", math.inf)
    assert free.best is not None
    tight_cap = free.best.memory_bytes * 0.5
    tight = search_layout(cfg, space, WL, "h100", tight_cap)
    assert tight.best is not None
    assert tight.best.memory_bytes <= tight_cap
    assert tight.best.step_time_s >= free.best.step_time_s
    assert tight.feasible_count < free.feasible_count


def test_no_layout_says_why() -> None:
    # 3 heads and 3 blocks on 8 devices with a global batch of 1: d = 1, so t·p = 8, and
    # neither 3 heads by t > 1 nor 3 blocks by p = 8 divide
    odd = ArchConfig(n_layers=3, d_model=6, n_heads=3, seq_len=64)
    space = LayoutSpace(devices=8, global_batch=1)
    none = search_layout(odd, space, None, "h100")
    assert none.best is None and none.divisible == 0
    assert "divides the architecture" in none.reason
    with pytest.raises(CostInputError) as info:
        none.metrics()
    assert info.value.field == "layout"
    big = ArchConfig(n_layers=8, d_model=512, n_heads=8, seq_len=256)
    capped = search_layout(big, LayoutSpace(devices=2, global_batch=4), WL, "h100", 1e3)
    assert capped.best is None and capped.divisible > 0
    assert f"{capped.min_memory_bytes:.4g} bytes per device" in capped.reason
    assert "over the cap of 1000 bytes" in capped.reason
    grid = best_layouts([odd, big], LayoutSpace(devices=2, global_batch=4), WL, "h100", 1e3)
    assert not grid.found.any()
    assert "over the cap" in grid.reasons[1]


def test_an_invalid_grid_point_keeps_its_reason() -> None:
    base = ArchConfig(n_layers=4, d_model=128, n_heads=4, seq_len=128)
    grid = ArchGrid.build(base, n_heads=np.array([4, 3]))  # 128 is not divisible by 3
    out = search_layout_grid(grid, LayoutSpace(devices=2, global_batch=4))
    assert out.found.tolist() == [True, False]
    assert out.reasons[1].startswith("n_heads")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"devices": 0, "global_batch": 4}, "devices"),
        ({"devices": 2.0, "global_batch": 4}, "devices"),
        ({"devices": 2, "global_batch": True}, "global_batch"),
        ({"devices": 2, "global_batch": 4, "max_virtual": 0}, "max_virtual"),
        ({"devices": 2, "global_batch": 4, "recompute": ("some",)}, "recompute"),
        ({"devices": 2, "global_batch": 4, "recompute": ()}, "recompute"),
        ({"devices": 2, "global_batch": 4, "sequence_parallel": (1,)}, "sequence_parallel"),
    ],
)
def test_a_bad_space_is_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(CostInputError) as info:
        LayoutSpace(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_too_many_layouts_are_refused_before_they_are_built() -> None:
    space = LayoutSpace(devices=4096, global_batch=1 << 20, max_layouts=1000)
    with pytest.raises(CostInputError) as info:
        space.layouts()
    assert info.value.field == "devices" and "more than 1000 layouts" in info.value.reason
    # d = 1 always divides the batch: a space is never empty
    odd_batch = LayoutSpace(devices=8, global_batch=3).layouts()
    assert {lay.data for lay in odd_batch} == {1}
    assert odd_batch[0] == Layout(1, 8, 1, 1, 1, 3, "none", False)


def test_a_bad_cap_or_keep_is_refused() -> None:
    cfg = SMALL[0]
    space = LayoutSpace(devices=2, global_batch=2)
    for cap in (0.0, -1.0, math.nan, math.inf * -1):
        with pytest.raises(CostInputError) as info:
            search_layout(cfg, space, None, "h100", cap)
        assert info.value.field == "memory_cap_bytes"
    with pytest.raises(CostInputError) as info:
        search_layout(cfg, space, None, "h100", None, keep=-1)
    assert info.value.field == "keep"
    # the default cap is the preset's device memory
    assert search_layout(cfg, space, None, "h200").memory_cap_bytes == 141e9


def test_sequence_parallelism_needs_the_sequence_split_evenly() -> None:
    """With sequence parallelism each tensor rank holds seq_len/t whole positions: at
    seq_len = 130 (= 2·5·13) t = 2 splits it and t = 4 does not; the workload's sequence
    length decides when it gives one."""
    cfg = ArchConfig(n_layers=4, d_model=128, n_heads=4, seq_len=130)
    space = LayoutSpace(devices=4, global_batch=4, max_virtual=1)
    found = search_layout(cfg, space, None, "h100", math.inf, keep=10_000)
    split = {(p.layout.tensor, p.layout.sequence_parallel) for p in found.feasible}
    assert (2, True) in split and (4, False) in split
    assert (4, True) not in split
    every = space.layouts()
    assert found.divisible == sum(not (lay.sequence_parallel and lay.tensor == 4) for lay in every)
    four_sp = next(lay for lay in every if lay.tensor == 4 and lay.sequence_parallel)
    assert not divides(cfg, four_sp)
    assert divides(cfg, four_sp, seq_len=132)
    grid = ArchGrid.build(cfg, seq_len=np.array([130, 132]))
    assert np.asarray(divides(grid, four_sp)).tolist() == [False, True]
    at_132 = search_layout(cfg, space, Workload(seq_len=132), "h100", math.inf, keep=10_000)
    assert (4, True) in {(p.layout.tensor, p.layout.sequence_parallel) for p in at_132.feasible}
