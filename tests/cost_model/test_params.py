"""Exact parameter counts against published references and independent hand counts."""

from __future__ import annotations

import math

import pytest

from cost_model import ArchConfig, param_count


def gpt2(n_layers: int, d_model: int, n_heads: int) -> ArchConfig:
    return ArchConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        vocab_size=50257,
        seq_len=1024,
        norm="layernorm",
        positions="learned",
        bias=True,
        tie_embeddings=True,
    )


@pytest.mark.parametrize(
    ("shape", "published"),
    [
        ((12, 768, 12), 124_439_808),  # GPT-2 small (Hugging Face "gpt2")
        ((24, 1024, 16), 354_823_168),  # GPT-2 medium
        ((36, 1280, 20), 774_030_080),  # GPT-2 large
        ((48, 1600, 25), 1_557_611_200),  # GPT-2 XL
    ],
)
def test_gpt2_family(shape: tuple[int, int, int], published: int) -> None:
    assert param_count(gpt2(*shape)).total == published


def test_gpt2_components() -> None:
    p = param_count(gpt2(12, 768, 12))
    assert p.embedding == 50257 * 768
    assert p.positions == 1024 * 768
    assert p.attention == 12 * (4 * 768 * 768 + 4 * 768)
    assert p.mlp == 12 * (2 * 768 * 3072 + 3072 + 768)
    assert p.norms == (2 * 12 + 1) * 2 * 768
    assert p.lm_head == 0 and p.depth_mixing == 0 and p.depth_aggregation == 0


BASE = {"n_layers": 6, "d_model": 64, "n_heads": 4}


def extras(variant: str, **kw: object) -> int:
    cfg = ArchConfig(**BASE, variant=variant, **kw)  # type: ignore[arg-type]
    plain = ArchConfig(**BASE)  # type: ignore[arg-type]
    return int(param_count(cfg).total - param_count(plain).total)


def test_variant_extras_by_hand() -> None:
    d, sub, lb = 64, 12, 6
    # pseudo-query + key-norm gain per sublayer, and the same for the output aggregation
    assert extras("full_attnres") == 2 * d * sub + 2 * d
    assert extras("block_attnres", block_size=4) == 2 * d * sub + 2 * d
    assert extras("attnres_sigmoid") == 2 * d * sub + 2 * d
    assert extras("attnres_no_key_norm") == d * sub + d
    assert extras("attnres_input_query") == (d * d + 2 * d) * sub + 2 * d
    # mHC-lite n = 4: projection (n·d → 2n + n!), its bias, three gates, per sublayer
    k = 2 * 4 + math.factorial(4)
    assert extras("mhc_lite") == (4 * d * k + k + 3) * sub
    n = 3
    k3 = 2 * n + math.factorial(n)
    assert extras("mhc_lite", mhc_streams=3) == (n * d * k3 + k3 + 3) * sub
    # DenseFormer: block i has i + 1 weights
    assert extras("denseformer") == sum(i + 1 for i in range(1, lb + 1))


def test_untied_head_grouped_kv_and_swiglu() -> None:
    tied = ArchConfig(n_layers=2, d_model=64, n_heads=8, vocab_size=1000)
    untied = tied.replace(tie_embeddings=False)
    assert param_count(untied).total - param_count(tied).total == 1000 * 64
    gqa = tied.replace(n_kv_heads=2)  # K and V shrink from 64 to 16 columns
    assert param_count(tied).attention - param_count(gqa).attention == 2 * 2 * 64 * (64 - 16)
    swiglu = tied.replace(mlp="swiglu", d_ff=100)
    assert param_count(swiglu).mlp == 2 * 3 * 64 * 100


def test_non_embedding_matches_kaplan_definition() -> None:
    p = param_count(gpt2(12, 768, 12))
    assert p.non_embedding == p.total - 50257 * 768 - 1024 * 768
