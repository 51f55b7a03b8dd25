"""Pins to published references: Megatron-LM's theoretical memory estimator, Narayanan et al.
2021's FLOPs count, and the per-stage layout of a pipeline.

Megatron-LM's estimator is `megatron/training/theoretical_memory_usage.py`
(github.com/NVIDIA/Megatron-LM): `compute_weight_and_optimizer_memory` and, under sequence
parallelism with selective recomputation, `compute_activation_memory`. Its figures are worked by
hand below, each formula in a comment, for a GPT-like configuration its formulas describe
exactly: RMSNorm (its norm_size = 1), no linear biases, GELU with f = 4h, no grouped-query
attention, rotary positions (it counts no position table), tied embeddings, a vocabulary that
needs no padding (V = 51200, a multiple of 128·t), bf16 activations with dropout
(`ActivationSettings.korthikanti`), micro-batch 1.
"""

from __future__ import annotations

import pytest

from cost_model import (
    ActivationSettings,
    ArchConfig,
    Parallelism,
    Workload,
    param_count,
    tokens_for_budget,
    training_flops_per_token,
    training_memory,
)
from cost_model.flops import recompute_flops_per_token
from cost_model.memory import stage_param_counts, training_memory_by_stage

L, H, A, V, S, B, T = 24, 2048, 16, 51200, 2048, 1, 8
GPT = ArchConfig(
    n_layers=L,
    d_model=H,
    n_heads=A,
    vocab_size=V,
    seq_len=S,
    norm="rmsnorm",
    positions="rope",
    dtype="bfloat16",
)
K = ActivationSettings.korthikanti()
SP_SELECTIVE = Workload(micro_batch=B, seq_len=S, recompute="selective")

# Megatron's parameters per layer: 2h·(f + norm_size) + 2h²·(1 + groups/heads) with f = 4h:
# 2h·(4h + 1) + 4h², and the final norm h.
MEGATRON_LAYER = 2 * H * (4 * H + 1) + 4 * H * H
MEGATRON_BLOCK = L * MEGATRON_LAYER + H  # "num_parameters_in_transformer_block"
EMBEDDING = V * H
# What we count differently: the norm gains act on the replicated residual stream, so every
# tensor rank holds them whole; Megatron's estimator divides them by t with the rest.
NORMS = L * 2 * H + H


def megatron_weight_params(pipeline: int) -> float:
    """Parameters on the most loaded shard (stage 0): (block/P + V·h)/t."""
    return (MEGATRON_BLOCK / pipeline + EMBEDDING) / T


def megatron_activations(pipeline: int, microbatches: int, virtual: int | None = None) -> float:
    """`compute_activation_memory` (Korthikanti et al. Table 2, sequence parallelism with
    selective recomputation), bytes on stage 0:
    s·b·h·(18 + 4·f/h)·L + 8·s·b·P + s·b·h·P, times the interleaved penalty
    1 + (P − 1)/(P·V) or, without interleaving, min(1, m/P); + 4·s·b·h·(1 + V/h) when P = 1;
    all divided by t."""
    act = S * B * H * (18 + 4 * (4 * H) / H) * L
    act += 8 * S * B * pipeline  # input to embedding, P micro-batches in flight
    act += S * B * H * pipeline  # dropout in embedding layer
    if virtual is not None:
        act *= 1 + (pipeline - 1) / (pipeline * virtual)
    elif pipeline > 1:
        act *= min(1, microbatches / pipeline)
    if pipeline == 1:
        act += S * B * H * 4 * (1 + V / H)  # inputs to output layer and CE loss
    return act / T


def test_megatron_weights_tensor8_pipeline1() -> None:
    """P = 1: the whole model over 8 tensor ranks. The matrices and the vocabulary-parallel
    embedding match Megatron's figure; the norm gains are whole on every rank in ours."""
    par = Parallelism(tensor=T, sequence_parallel=True)
    mem = training_memory(GPT, SP_SELECTIVE, par, K)
    ours = mem.weights_bytes / 4  # fp32 weights, 4 B per parameter
    assert ours == pytest.approx(megatron_weight_params(1) - NORMS / T + NORMS, rel=1e-12)
    # 16 B per parameter (fp32 weights and gradients, AdamW's two moments) where Megatron's
    # non-distributed optimizer counts 18 (bf16 weights, fp32 gradients, fp32 master + moments)
    assert mem.weights_bytes + mem.gradient_bytes + mem.optimizer_bytes == 16 * ours


def test_megatron_weights_tensor8_pipeline4() -> None:
    """P = 4: stage 0 holds L/P blocks and the whole embedding (over the tensor ranks), as
    Megatron's most loaded shard; Megatron also spreads the final norm over the stages (h/P),
    ours sits on the last stage."""
    p = 4
    stages = stage_param_counts(GPT, Parallelism(tensor=T, pipeline=p, sequence_parallel=True))
    block_norms = L * 2 * H
    expected_first = megatron_weight_params(p) - (block_norms + H) / (p * T) + block_norms / p
    assert stages[0] == pytest.approx(expected_first, rel=1e-12)
    # the last stage: the same blocks, the final norm and the tied head's copy of the embedding
    assert stages[-1] == pytest.approx(expected_first + H, rel=1e-12)
    assert stages[1] == pytest.approx(expected_first - EMBEDDING / T, rel=1e-12)


def test_megatron_activations_tensor8_pipeline1() -> None:
    """Blocks, embedding dropout mask and the head's 4·s·b·h·(1 + V/h), all over t: equal to
    Megatron's. The int64 ids differ: Megatron counts the input ids once, divided by t; every
    tensor rank holds both the input ids and the targets whole (8·s·b each) in ours."""
    par = Parallelism(tensor=T, sequence_parallel=True)
    mem = training_memory(GPT, SP_SELECTIVE, par, K)
    ids_ours, ids_megatron = 2 * 8 * S * B, 8 * S * B / T
    assert mem.activation_bytes - ids_ours == pytest.approx(
        megatron_activations(1, 1) - ids_megatron, rel=1e-12
    )


@pytest.mark.parametrize("microbatches", [8, 2])
def test_megatron_activations_tensor8_pipeline4(microbatches: int) -> None:
    """P = 4, 1F1B: stage 0 holds min(m, P) micro-batches of L/P blocks and of the embedding's
    activations, as Megatron's estimator says; the head's are on the last stage."""
    p = 4
    par = Parallelism(tensor=T, pipeline=p, sequence_parallel=True)
    wl = SP_SELECTIVE.replace(microbatches=microbatches)
    stages = training_memory_by_stage(GPT, wl, par, K)
    in_flight = min(microbatches, p)
    ids_ours, ids_megatron = in_flight * 8 * S * B, in_flight * 8 * S * B / T
    assert stages[0].activation_bytes - ids_ours == pytest.approx(
        megatron_activations(p, microbatches) - ids_megatron, rel=1e-12
    )
    # the last stage: one micro-batch of L/P blocks and the head's activations, over t
    head = (S * B * H * 4 * (1 + V / H)) / T + 8 * S * B
    assert stages[-1].activation_bytes == pytest.approx(
        S * B * H * 34 * (L / p) / T + head, rel=1e-12
    )
    mem = training_memory(GPT, wl, par, K)
    assert mem.stage == 0
    assert mem.activation_bytes == stages[0].activation_bytes


def test_megatron_interleaved_penalty() -> None:
    """V = 2 virtual stages: stage 0 holds (1 + (P − 1)/(P·V)) × the non-interleaved figure."""
    p, v = 4, 2
    par = Parallelism(tensor=T, pipeline=p, virtual=v, sequence_parallel=True)
    stage0 = training_memory_by_stage(GPT, SP_SELECTIVE.replace(microbatches=8), par, K)[0]
    penalty = 1 + (p - 1) / (p * v)
    ids_ours, ids_megatron = p * penalty * 8 * S * B, p * penalty * 8 * S * B / T
    assert stage0.activation_bytes - ids_ours == pytest.approx(
        megatron_activations(p, 8, virtual=v) - ids_megatron, rel=1e-12
    )


# GPT-2 small (Radford et al. 2019; the Hugging Face checkpoint's 124,439,808 parameters)
GPT2 = ArchConfig(
    n_layers=12,
    d_model=768,
    n_heads=12,
    vocab_size=50257,
    seq_len=1024,
    norm="layernorm",
    positions="learned",
    bias=True,
)


def test_gpt2_small_eight_stages_keeps_the_embedding_whole() -> None:
    """At P = 8 the first stage holds the whole embedding and the position table with its 1.5
    blocks; its fp32 weights cannot be less than the fp32 embedding (issue 16, defect 1)."""
    assert param_count(GPT2).total == 124_439_808
    mem = training_memory(GPT2, Workload(micro_batch=1, microbatches=8), Parallelism(pipeline=8))
    assert mem.weights_bytes >= 4 * 50257 * 768
    per_block = (param_count(GPT2).total - 50257 * 768 - 1024 * 768 - 2 * 768) / 12
    assert mem.stage == 0
    assert mem.weights_bytes == pytest.approx(4 * (50257 * 768 + 1024 * 768 + 1.5 * per_block))


# -- FLOPs: Narayanan et al. 2021 (arXiv 2104.04473) --------------------------------------------
@pytest.mark.parametrize("shape", [(24, 2048, 16, 2048, 51200), (96, 12288, 96, 2048, 51200)])
def test_narayanan_flops_with_and_without_recomputation(
    shape: tuple[int, int, int, int, int],
) -> None:
    """Per step of B sequences: 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) model FLOPs, and with full
    recomputation 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) hardware FLOPs."""
    n_layers, h, heads, s, vocab = shape
    cfg = ArchConfig(n_layers=n_layers, d_model=h, n_heads=heads, seq_len=s, vocab_size=vocab)
    b = 4
    plain = 72 * b * s * n_layers * h * h * (1 + s / (6 * h) + vocab / (12 * n_layers * h))
    full = 96 * b * s * n_layers * h * h * (1 + s / (6 * h) + vocab / (16 * n_layers * h))
    assert b * s * training_flops_per_token(cfg) == pytest.approx(plain, rel=1e-12)
    assert b * s * training_flops_per_token(cfg, recompute="full") == pytest.approx(full, rel=1e-12)
    # selective recomputation repeats Q·Kᵀ and A·V: 4·B·s²·h per layer (Korthikanti et al.)
    assert b * s * training_flops_per_token(cfg, recompute="selective") == pytest.approx(
        plain + 4 * b * s * s * h * n_layers, rel=1e-12
    )


def test_budget_counts_model_flops_unless_told_otherwise() -> None:
    """A budget is in model FLOPs by default (what the service and the workers pass); in
    hardware FLOPs, full recomputation buys fewer tokens."""
    cfg = GPT.replace(n_layers=4, d_model=256, n_heads=4, seq_len=256)
    budget = 1e15
    plain = training_flops_per_token(cfg, causal=True)
    assert tokens_for_budget(cfg, budget) == int(budget // plain)
    extra = recompute_flops_per_token(cfg, "full", causal=True)
    assert tokens_for_budget(cfg, budget, recompute="full") == int(budget // (plain + extra))
    assert tokens_for_budget(cfg, budget, recompute="full") < tokens_for_budget(cfg, budget)
