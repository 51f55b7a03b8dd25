"""FLOPs per token: the standard references and the depth-mixing closed forms."""

from __future__ import annotations

import pytest

from cost_model import (
    VARIANTS,
    ArchConfig,
    Variant,
    decode_flops_per_token,
    forward_flops_per_token,
    param_count,
    prefill_flops,
    training_flops_per_token,
)
from cost_model.depth import aggregation_sources, attended_sources_total


def reference_sources(variant: str, n_sublayers: int, block_size: int | None) -> list[int]:
    """Sources per sublayer, enumerated straight from the paper's definitions."""
    counts = []
    for j in range(n_sublayers):  # 0-based sublayer index
        if variant == "block_attnres":
            assert block_size is not None
            n, i = divmod(j, block_size)  # block n (0-based), position i (0-based)
            counts.append(1 + n + (1 if i >= 1 else 0))  # b_0..b_n (+ partial b_n^i if i ≥ 1)
        else:
            counts.append(j + 1)  # v_0 .. v_j
    return counts


@pytest.mark.parametrize(
    ("n_layers", "block_size"),
    [(n, s) for n in (1, 2, 3, 5, 8, 13) for s in (1, 2, 3, 4, 7, 26) if s <= 2 * n],
)
def test_block_source_counts_match_enumeration(n_layers: int, block_size: int) -> None:
    cfg = ArchConfig(
        n_layers=n_layers, d_model=32, n_heads=2, variant="block_attnres", block_size=block_size
    )
    assert attended_sources_total(cfg) == sum(
        reference_sources("block_attnres", 2 * n_layers, block_size)
    )
    assert aggregation_sources(cfg) == -(-2 * n_layers // block_size) + 1


def test_block_limits_equal_full_and_standard() -> None:
    full = ArchConfig(n_layers=6, d_model=32, n_heads=2, variant="full_attnres")
    s1 = full.replace(variant="block_attnres", block_size=1)
    assert attended_sources_total(s1) == attended_sources_total(full)
    assert (
        forward_flops_per_token(s1).depth_mixing_flops
        == forward_flops_per_token(full).depth_mixing_flops
    )
    # one block: every sublayer sees the embedding and (after the first) the running sum
    one = full.replace(variant="block_attnres", block_size=12)
    assert attended_sources_total(one) == 1 + 11 * 2


def test_depth_mixing_growth_full_quadratic_block_linear() -> None:
    def mixing(variant: str, n_layers: int, **kw: object) -> float:
        cfg = ArchConfig(n_layers=n_layers, d_model=64, n_heads=4, variant=variant, **kw)  # type: ignore[arg-type]
        return float(forward_flops_per_token(cfg).depth_mixing_flops)

    # Full: 4·d·(L(L+1)/2 + L + 1) — quadruple-ish when L doubles
    assert mixing("full_attnres", 32) / mixing("full_attnres", 16) > 3.8
    # Block with N fixed (S grows with L): linear in L
    ratio = mixing("block_attnres", 32, block_size=8) / mixing("block_attnres", 16, block_size=4)
    assert 1.9 < ratio < 2.2
    assert mixing("baseline", 16) == 0


def matmul_params(cfg: ArchConfig) -> int:
    p = param_count(cfg)
    return int(p.attention + p.mlp + cfg.vocab_size * cfg.d_model)


@pytest.mark.parametrize("shape", [(12, 768, 12, 1024), (4, 256, 4, 256), (24, 2048, 16, 2048)])
def test_training_flops_are_6ND_plus_attention(shape: tuple[int, int, int, int]) -> None:
    n_layers, d, heads, s = shape
    cfg = ArchConfig(n_layers=n_layers, d_model=d, n_heads=heads, seq_len=s, vocab_size=50257)
    n = matmul_params(cfg)
    # dense s×s attention (what a FLOP counter sees): 3 × 4·L·s·d
    assert training_flops_per_token(cfg) == 6 * n + 12 * n_layers * s * d
    # causal (Kaplan et al. 2020): C = 6N + 6·n_layer·n_ctx·d_attn, with the exact mean (s+1)/2
    assert training_flops_per_token(cfg, causal=True) == pytest.approx(
        6 * n + 6 * n_layers * (s + 1) * d
    )
    # Narayanan et al. 2021: forward 24·b·s·h² + 4·b·s²·h per layer plus 2·b·s·h·V logits
    per_token_forward = n_layers * (24 * d * d + 4 * s * d) + 2 * d * 50257
    assert forward_flops_per_token(cfg).total_flops == per_token_forward


def test_prefill_and_decode() -> None:
    cfg = ArchConfig(n_layers=4, d_model=128, n_heads=4, seq_len=512)
    static = forward_flops_per_token(cfg, attended=0)
    t = 100
    brute = sum(
        static.total_flops - static.lm_head_flops + 4 * 4 * k * 128 for k in range(1, t + 1)
    )
    assert prefill_flops(cfg, t) == brute + static.lm_head_flops
    assert decode_flops_per_token(cfg, 300) - decode_flops_per_token(cfg, 100) == 4 * 4 * 200 * 128


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_costs_at_least_the_baseline(variant: Variant) -> None:
    cfg = ArchConfig(
        n_layers=8,
        d_model=128,
        n_heads=4,
        variant=variant,
        block_size=4 if variant == "block_attnres" else None,
    )
    base = cfg.replace(variant="baseline", block_size=None)
    assert forward_flops_per_token(cfg).total_flops >= forward_flops_per_token(base).total_flops
    if variant != "baseline":
        assert forward_flops_per_token(cfg).depth_mixing_flops > 0
