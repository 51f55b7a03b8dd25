"""The vectorised path prices a grid exactly as the scalar path prices each point."""

from __future__ import annotations

import random
from typing import cast

import numpy as np
import pytest

from cost_model import (
    METRICS,
    VARIANTS,
    ArchConfig,
    ArchConfigError,
    Parallelism,
    Variant,
    Workload,
    price,
    price_grid,
    price_many,
)

# prefill and decode within seq_len: a learned position table refuses longer ones
WL = Workload(micro_batch=4, seq_len=512, microbatches=8, prefill_tokens=512, prefill_chunk=128)
PAR = Parallelism(tensor=2, pipeline=2, virtual=2, data=4, sequence_parallel=True)


def random_configs(rng: random.Random, n: int) -> list[ArchConfig]:
    out: list[ArchConfig] = []
    while len(out) < n:
        variant = cast(Variant, rng.choice(VARIANTS))  # VARIANTS is get_args(Variant)
        n_layers = rng.randint(1, 24)
        heads = rng.choice([1, 2, 4, 8])
        d = heads * rng.choice([16, 32, 64])
        try:
            out.append(
                ArchConfig(
                    n_layers=n_layers,
                    d_model=d,
                    n_heads=heads,
                    vocab_size=rng.choice([256, 50257]),
                    seq_len=512,
                    mlp=rng.choice(["gelu", "swiglu"]),
                    norm=rng.choice(["rmsnorm", "layernorm"]),
                    positions=rng.choice(["rope", "learned"]),
                    bias=rng.random() < 0.5,
                    tie_embeddings=rng.random() < 0.5,
                    variant=variant,
                    block_size=rng.randint(1, 2 * n_layers) if variant == "block_attnres" else None,
                    mhc_streams=rng.choice([2, 3, 4]) if variant == "mhc_lite" else None,
                    dtype=rng.choice(["float32", "bfloat16"]),
                )
            )
        except ArchConfigError:
            continue
    return out


def test_price_many_equals_scalar_price() -> None:
    configs = random_configs(random.Random(0), 200)
    many = price_many(configs, WL, PAR, "h200")
    for i, cfg in enumerate(configs):
        scalar = price(cfg, WL, PAR, "h200").metrics()
        for name in METRICS:
            assert many[name][i] == pytest.approx(float(scalar[name]), rel=1e-12), (name, cfg)


def test_price_grid_marks_invalid_points() -> None:
    base = ArchConfig(n_layers=4, d_model=128, n_heads=4, variant="block_attnres", block_size=2)
    grid = price_grid(
        base,
        n_layers=np.array([2, 4, 1, 4]),
        d_model=np.array([64, 128, 64, 130]),
        block_size=np.array([2, 8, 3, 2]),
    )
    assert grid.valid.tolist() == [True, True, False, False]
    assert grid.reasons[2].startswith("block_size")
    assert grid.reasons[3].startswith("n_heads")
    assert np.isnan(grid.metrics["params"][2:]).all()
    ok = price(base.replace(n_layers=4, d_model=128, block_size=8)).metrics()
    assert grid.metrics["params"][1] == ok["params"]
    assert grid.metrics["train_memory_bytes"][1] == pytest.approx(ok["train_memory_bytes"])


def test_price_grid_rejects_unknown_axes() -> None:
    with pytest.raises(ArchConfigError, match="colour"):
        price_grid(ArchConfig(n_layers=2, d_model=64, n_heads=2), colour=np.array([1]))


def test_report_json_is_plain() -> None:
    import json

    cfg = ArchConfig(n_layers=2, d_model=64, n_heads=2, variant="mhc_lite")
    text = json.dumps(price(cfg, WL, PAR).as_dict())
    back = json.loads(text)
    assert set(back["metrics"]) == set(METRICS)
    assert back["params"]["total"] == back["metrics"]["params"]
