"""Pipeline traffic with and without cross-stage caching, and the residual I/O of Table 1."""

from __future__ import annotations

from typing import cast

import pytest

from cost_model import (
    VARIANTS,
    ArchConfig,
    Parallelism,
    Variant,
    Workload,
    pipeline_comm,
    residual_io,
)
from cost_model.comm import (
    allreduce_bytes,
    pipeline_bubble_fraction,
    tensor_parallel_bytes_per_step,
)


def simulate(stages: int, virtual: int, per_chunk: int, cached: bool) -> list[int]:
    """Representations sent at each transition, chunk by chunk in pipeline order.

    Naive: everything produced so far. Cached (the paper's accounting): in the first round the
    growing prefix; afterwards a window of the last P chunks' representations."""
    chunks = stages * virtual
    sent = []
    for j in range(1, chunks):  # hand-over after chunk j (1-based)
        if not cached or j < stages:
            sent.append(j * per_chunk)
        else:
            sent.append(stages * per_chunk)
    return sent


# L = 64 sublayers in N = 16 blocks of S = 4: with P = 4, V = 2 (C = 8), N_p = 2 per chunk.
CFG = ArchConfig(n_layers=32, d_model=512, n_heads=8, variant="block_attnres", block_size=4)


def test_pipeline_closed_forms_p4_v2() -> None:
    p, v, n_p, d, e = 4, 2, 2, 512, 4
    c = p * v
    comm = pipeline_comm(CFG, Parallelism(pipeline=p, virtual=v))
    assert comm.transitions == c - 1
    assert comm.naive_bytes_per_token == c * (c - 1) / 2 * n_p * d * e  # 56 blocks
    assert comm.cached_bytes_per_token == (p * (p - 1) / 2 * n_p + (v - 1) * p * p * n_p) * d * e
    assert comm.naive_bytes_per_token == sum(simulate(p, v, n_p, False)) * d * e
    assert comm.cached_bytes_per_token == sum(simulate(p, v, n_p, True)) * d * e
    # peak per transition: O(C) naive, O(P) cached
    assert comm.naive_peak_bytes_per_token == (c - 1) * n_p * d * e
    assert comm.cached_peak_bytes_per_token == p * n_p * d * e
    assert comm.naive_peak_bytes_per_token == max(simulate(p, v, n_p, False)) * d * e
    assert comm.cached_peak_bytes_per_token == max(simulate(p, v, n_p, True)) * d * e


def test_peak_grows_with_chunks_only_without_caching() -> None:
    peaks = []
    for v in (1, 2, 4):
        comm = pipeline_comm(CFG, Parallelism(pipeline=4, virtual=v))
        per_chunk = CFG.n_blocks / (4 * v) * 512 * 4
        peaks.append(
            (
                comm.naive_peak_bytes_per_token / per_chunk,
                comm.cached_peak_bytes_per_token / per_chunk,
            )
        )
    assert [n for n, _ in peaks] == [3, 7, 15]  # C − 1
    assert [c for _, c in peaks] == [3, 4, 4]  # bounded by P


def test_per_step_and_standard_residual() -> None:
    wl = Workload(micro_batch=2, seq_len=128, microbatches=8)
    comm = pipeline_comm(CFG, Parallelism(pipeline=4, virtual=2), wl)
    assert comm.cached_bytes_per_step == 2 * 2 * 128 * 8 * comm.cached_bytes_per_token
    base = pipeline_comm(
        CFG.replace(variant="baseline", block_size=None), Parallelism(pipeline=4, virtual=2), wl
    )
    assert base.naive_bytes_per_token == base.cached_bytes_per_token == 7 * 512 * 4
    assert comm.bubble_fraction == pipeline_bubble_fraction(4, 2, 8) == 3 / 16


def test_tensor_parallel_bytes() -> None:
    wl = Workload(micro_batch=1, seq_len=1024)
    got = tensor_parallel_bytes_per_step(CFG, Parallelism(tensor=8), wl)
    message = 1024 * 512 * 4
    assert got == 4 * 32 * 2 * 7 / 8 * message
    assert allreduce_bytes(100, 1) == 0


def paper_cfg(variant: Variant) -> ArchConfig:
    return ArchConfig(
        n_layers=64,
        d_model=1024,
        n_heads=16,
        variant=variant,
        block_size=16 if variant == "block_attnres" else None,
    )


def test_table1_residual_io() -> None:
    """L = 128, N = 8, S = 16, m = 4: 3d, 34d + 48, 24d, 5.5d."""
    table1: tuple[Variant, ...] = ("baseline", "mhc_lite", "full_attnres", "block_attnres")
    rows = {v: residual_io(paper_cfg(v)) for v in table1}
    assert (rows["baseline"].d_multiple, rows["baseline"].scalars) == (3, 0)
    assert (rows["mhc_lite"].d_multiple, rows["mhc_lite"].scalars) == (34, 48)
    assert (rows["full_attnres"].d_multiple, rows["full_attnres"].scalars) == (24, 0)
    assert (rows["block_attnres"].d_multiple, rows["block_attnres"].scalars) == (5.5, 0)
    assert rows["block_attnres"].bytes == 5.5 * 1024 * 4


def test_io_general_formulas() -> None:
    block = ArchConfig(n_layers=16, d_model=64, n_heads=4, variant="block_attnres", block_size=4)
    assert residual_io(block).d_multiple == 8 / 4 + 5
    full = block.replace(variant="full_attnres", block_size=None)
    assert residual_io(full, schedule_block=8).d_multiple == 8 + 4
    mhc = block.replace(variant="mhc_lite", block_size=None, mhc_streams=2)
    assert (residual_io(mhc).d_multiple, residual_io(mhc).scalars) == (18, 16)
    # naive schedule reads every source as key and value
    assert residual_io(full, schedule="naive").d_multiple == 2 * (32 * 33 / 2) / 32 + 3
    with pytest.raises(ValueError, match="schedule"):
        residual_io(full, schedule="fast")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_has_io_at_least_standard(variant: Variant) -> None:
    assert residual_io(paper_cfg(variant)).d_multiple >= 3


def test_pipeline_streams_and_dense_block_outputs() -> None:
    """mHC-lite carries its n streams across every transition (caching changes nothing);
    DenseFormer sends its block outputs like AttnRes's depth representations."""
    par = Parallelism(pipeline=4, virtual=2)  # C = 8 chunks
    d, e = 512, 4
    mhc = pipeline_comm(CFG.replace(variant="mhc_lite", block_size=None, mhc_streams=3), par)
    assert mhc.naive_bytes_per_token == mhc.cached_bytes_per_token == 7 * 3 * d * e
    assert mhc.naive_peak_bytes_per_token == mhc.cached_peak_bytes_per_token == 3 * d * e
    dense = pipeline_comm(CFG.replace(variant="denseformer", block_size=None), par)
    n_p = 32 / 8  # L_b block outputs over C chunks
    assert dense.naive_bytes_per_token == sum(simulate(4, 2, 4, False)) * d * e
    assert dense.cached_bytes_per_token == sum(simulate(4, 2, 4, True)) * d * e
    assert dense.cached_peak_bytes_per_token == 4 * n_p * d * e
    # VARIANTS is get_args(Variant), typed as plain strings
    for variant in cast(tuple[Variant, ...], VARIANTS):  # one chunk: nothing crosses
        cfg = paper_cfg(variant)
        alone = pipeline_comm(cfg, Parallelism())
        assert alone.naive_bytes_per_token == alone.cached_bytes_per_token == 0, variant
        assert alone.naive_peak_bytes_per_token == alone.cached_peak_bytes_per_token == 0
