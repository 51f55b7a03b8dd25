"""Memory: Korthikanti et al.'s activation formula and the paper's prefill figures."""

from __future__ import annotations

import pytest

from cost_model import ActivationSettings, ArchConfig, Parallelism, Workload, training_memory
from cost_model.memory import (
    block_activations,
    depth_mixing_activation_bytes,
    kv_cache_bytes,
    prefill_depth_cache_bytes,
)

# GPT-3 175B as configured by Korthikanti et al. 2022 (Table 3): a = 96, h = 12288, s = 2048,
# L = 96, micro-batch 1.
GPT3 = ArchConfig(
    n_layers=96,
    d_model=12288,
    n_heads=96,
    vocab_size=51200,
    seq_len=2048,
    norm="layernorm",
    positions="learned",
    bias=True,
    dtype="bfloat16",
)
K = ActivationSettings.korthikanti()
S, B, H, A = 2048, 1, 12288, 96


def per_layer(**kw: object) -> float:
    return float(block_activations(GPT3, B, S, settings=K, **kw).total_bytes)  # type: ignore[arg-type]


def test_korthikanti_no_parallelism() -> None:
    assert per_layer() == S * B * H * (34 + 5 * A * S / H)


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_tensor_and_sequence_parallel(t: int) -> None:
    assert per_layer(tensor=t) == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)))
    assert per_layer(tensor=t, sequence_parallel=True) == pytest.approx(
        S * B * H * (34 / t + 5 * A * S / (H * t))
    )
    assert per_layer(tensor=t, sequence_parallel=True, recompute="selective") == pytest.approx(
        S * B * H * 34 / t
    )


def test_korthikanti_full_recompute_keeps_the_block_input() -> None:
    assert per_layer(recompute="full") == 2 * S * B * H


def test_korthikanti_gpt3_total_per_stage() -> None:
    # 2.87 GB per layer without parallelism: 34 + 80 = 114 sbh
    assert per_layer() == pytest.approx(2.869e9, rel=1e-3)


def test_other_settings_change_the_right_terms() -> None:
    cfg = ArchConfig(n_layers=4, d_model=256, n_heads=4, seq_len=256, dtype="float32")
    s, b, d = 256, 2, 256
    plain = ActivationSettings(act_bytes=4, dropout=False, fused_attention=False, norm_stats=False)
    # fp32, no dropout, unfused: the non-mask terms double, masks vanish, s² term = probs only
    got = block_activations(cfg, b, s, settings=plain).total_bytes
    assert got == s * b * d * 2 * (34 - 2) + 4 * 4 * s * s * b
    fused = ActivationSettings(act_bytes=4, dropout=False, fused_attention=True, norm_stats=False)
    got_fused = block_activations(cfg, b, s, settings=fused).total_bytes
    # fused: no s² term; the kernel's output is the output projection's input (one tensor)
    assert got_fused == s * b * d * 2 * (34 - 2) + 4 * 4 * s * b
    stats = ActivationSettings(act_bytes=4, dropout=False, fused_attention=True, norm_stats=True)
    # RMSNorm extras: 1/rms (fp32) and the normalised tensor before the gain, per norm
    extras = 2 * (4 * s * b + 4 * s * b * d)
    assert block_activations(cfg, b, s, settings=stats).total_bytes == got_fused + extras


def test_training_memory_parts() -> None:
    cfg = ArchConfig(n_layers=4, d_model=128, n_heads=4)
    mem = training_memory(cfg, Workload(micro_batch=4))
    from cost_model import param_count

    p = param_count(cfg).total
    assert (mem.weights_bytes, mem.gradient_bytes, mem.optimizer_bytes) == (4 * p, 4 * p, 8 * p)
    assert mem.total_bytes == 16 * p + mem.activation_bytes
    split = training_memory(cfg, Workload(micro_batch=4), Parallelism(tensor=2, pipeline=2))
    # the last stage is the most loaded (one micro-batch in flight on each, the logits here):
    # 2 blocks' matrices over 2 tensor ranks, their norm gains (replicated), the final norm
    # and the tied head's copy of the embedding (vocabulary-parallel)
    matrices = 4 * (4 * 128 * 128 + 2 * 128 * 512)
    last = matrices / (2 * 2) + 4 * 2 * 128 / 2 + 128 + 256 * 128 / 2
    assert split.stage == 1
    assert split.weights_bytes == 4 * last
    less = training_memory(cfg, Workload(micro_batch=4, recompute="full"))
    assert less.activation_bytes < mem.activation_bytes


def test_depth_sources_kept_alive_full_versus_block() -> None:
    full = ArchConfig(n_layers=16, d_model=256, n_heads=4, variant="full_attnres")
    block = full.replace(variant="block_attnres", block_size=8)  # N = 4
    wl = Workload(micro_batch=1, seq_len=128)
    e = 4 * 256 * 128
    assert training_memory(full, wl).depth_sources_live_bytes == (32 + 1) * e
    assert training_memory(block, wl).depth_sources_live_bytes == (4 + 1) * e
    base = full.replace(variant="baseline")
    assert training_memory(base, wl).depth_sources_live_bytes == e
    assert depth_mixing_activation_bytes(base, 1, 128) == 0
    assert depth_mixing_activation_bytes(full, 1, 128) > 0


PAPER = ArchConfig(
    n_layers=64,
    d_model=7168,
    n_heads=56,
    variant="block_attnres",
    block_size=16,
    dtype="bfloat16",
    seq_len=131072,
)  # L = 128 sublayers, S = 16, N = 8


def test_prefill_block_cache_figures() -> None:
    t = 128 * 1024
    assert PAPER.n_blocks == 8
    whole = prefill_depth_cache_bytes(PAPER, t)
    assert whole == 8 * t * 7168 * 2
    assert whole == pytest.approx(15e9, rel=0.01)  # ≈ 15 GB
    sharded = prefill_depth_cache_bytes(PAPER, t, shards=8)
    assert sharded == pytest.approx(1.9e9, rel=0.02)  # ≈ 1.9 GB per device
    chunked = prefill_depth_cache_bytes(PAPER, t, shards=8, chunk=16 * 1024)
    assert chunked < 0.3e9  # < 0.3 GB per device


def test_kv_cache() -> None:
    cfg = ArchConfig(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, dtype="bfloat16")
    # Llama-style GQA: 2 · 32 layers · 1024 · 2 bytes = 128 KiB per token
    assert kv_cache_bytes(cfg, 1) == 128 * 1024
    assert kv_cache_bytes(cfg, 4096, batch=2, shards=4) == 128 * 1024 * 4096 * 2 / 4


# -- the most loaded stage among all P ------------------------------------------------------------
STAGED = [
    ArchConfig(n_layers=24, d_model=128, n_heads=4, vocab_size=5000),
    ArchConfig(n_layers=24, d_model=128, n_heads=4, tie_embeddings=False, vocab_size=64),
    ArchConfig(n_layers=24, d_model=64, n_heads=4, variant="full_attnres"),
    ArchConfig(n_layers=24, d_model=64, n_heads=4, variant="block_attnres", block_size=4),
    ArchConfig(n_layers=24, d_model=64, n_heads=4, variant="mhc_lite"),
    ArchConfig(n_layers=24, d_model=64, n_heads=4, variant="denseformer"),
]
LAYOUTS = [(p, v, m) for p in (1, 2, 3, 4, 6, 8) for v in (1, 2, 3) for m in (1, 2, 5, 12)]


@pytest.mark.parametrize("cfg", STAGED, ids=lambda c: f"{c.variant}-tied{c.tie_embeddings}")
def test_the_most_loaded_stage_is_the_largest_of_all_stages(
    cfg: ArchConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`training_memory` and the step times look at the first, second and last stages only
    (`distinct_stages`): the figures equal those of every stage priced (the first on a tie,
    the same stage index), for scalars and a grid."""
    import numpy as np

    from cost_model import ArchGrid, get_hardware
    from cost_model import memory as memory_module
    from cost_model import timing as timing_module
    from cost_model.memory import training_memory_by_stage

    hw = get_hardware("h100")
    grid = ArchGrid.build(cfg, d_model=np.array([64, 128, 256]), n_heads=np.array([4, 4, 8]))
    cases = []
    for p, v, m in LAYOUTS:
        if v > 1 and p == 1:
            continue
        for recompute in ("none", "full"):
            par = Parallelism(tensor=2, pipeline=p, virtual=v, data=2)
            wl = Workload(micro_batch=2, seq_len=64, microbatches=m, recompute=recompute)
            for arch in (cfg, grid):
                mem = training_memory(arch, wl, par)
                every = training_memory_by_stage(arch, wl, par)
                assert len(every) == p
                totals = np.stack([np.asarray(s.total_bytes, dtype=float) for s in every])
                np.testing.assert_array_equal(mem.total_bytes, totals.max(axis=0))
                np.testing.assert_array_equal(mem.stage, totals.argmax(axis=0))
                cases.append(
                    (
                        arch,
                        wl,
                        par,
                        mem.as_dict(),
                        timing_module.train_step_time(arch, wl, par, hw).as_dict(),
                        timing_module.decode_token_time(arch, wl, par, hw).as_dict(),
                    )
                )
    monkeypatch.setattr(timing_module, "distinct_stages", lambda p: list(range(p)))
    monkeypatch.setattr(memory_module, "distinct_stages", lambda p: list(range(p)))
    for arch, wl, par, mem_figures, step, decode in cases:
        every_mem = training_memory(arch, wl, par).as_dict()
        every_step = timing_module.train_step_time(arch, wl, par, hw).as_dict()
        every_decode = timing_module.decode_token_time(arch, wl, par, hw).as_dict()
        for figures, reference in (
            (mem_figures, every_mem),
            (step, every_step),
            (decode, every_decode),
        ):
            assert figures.keys() == reference.keys()
            for key in figures:
                np.testing.assert_array_equal(figures[key], reference[key], err_msg=key)
