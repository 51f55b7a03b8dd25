"""Closed forms worked by hand for a tiny model, pinning the step time, the decoded-token
time, the data-parallel all-reduce and the inference memory term by term.

The tiny model: L_b = 2 blocks, d = 64, 4 heads (kv = 64), V = 100, s = 16, GELU with
f = 256, RMSNorm with gains, no biases, RoPE, tied embeddings, the standard residual.
Parameters: embedding V·d = 6,400; per block attention 4·d² = 16,384, MLP 2·d·f = 32,768 and
two norm gains 2·d = 128 (49,280); the final norm d = 64. Total 6,400 + 2·49,280 + 64 =
105,024. Forward FLOPs per token at s = 16: projections 2·L_b·4d² = 65,536, attention core
4·L_b·s·d = 8,192, MLP 2·L_b·2·d·f = 131,072, head 2·d·V = 12,800: 217,600.

Every figure below is a literal or arithmetic on literals (never a call into the cost model), so
that each term the model computes is checked against its formula.
"""

from __future__ import annotations

import numpy as np
import pytest

from cost_model import (
    ArchConfig,
    ArchGrid,
    CostInputError,
    Hardware,
    Parallelism,
    Workload,
    get_hardware,
    inference_memory,
    price,
    training_memory,
)
from cost_model.comm import data_parallel_bytes_per_step
from cost_model.flops import decode_flops_per_token, prefill_flops
from cost_model.timing import decode_token_time, train_step_time

TINY = ArchConfig(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=16)
PARAMS = 105_024
BLOCK = 49_280
FORWARD = 217_600
HEAD = 12_800
H100 = get_hardware("h100").peak_only()  # the datasheet roofline: fractions 1, no latency
FP32_PEAK, HBM, LINK = 67e12, 3.35e12, 450e9  # H100 SXM5 datasheet: FLOP/s, bytes/s, bytes/s

# Activations one micro-batch saves (b = 2, s = 16: sb = 32 rows; fp32, e = 4; fused attention,
# no dropout, norm statistics counted):
#   one norm's extras (fp32 1/rms + the tensor before the gain): (4 + 4·64)·32 = 8,320
#   a block: replicated 4·e·sb·d + 2 norms' extras = 32,768 + 16,640 = 49,408;
#            sharded Q, K e·sb·2d + V e·sb·d + O input e·sb·d + GELU 2·e·sb·f = 98,304;
#            the fused kernel's fp32 log-sum-exp 4·a·sb = 512  → 148,224
#   the embedding's: int64 ids 8·sb = 256
#   the head's: final-norm and head inputs 2·e·sb·d = 16,384, one norm's extras 8,320,
#               fp32 log-softmax 4·sb·V = 12,800, int64 targets 256  → 37,760
ACT_BLOCK, ACT_EMBED, ACT_HEAD = 148_224, 256, 37_760
WL = Workload(micro_batch=2, seq_len=16, microbatches=4, decode_batch=3)
TOKENS = 16 * 2 * 4  # s·b·m per optimizer step
# AdamW traffic per parameter and step: m·(3 weight reads at e = 4 + 8 B gradient
# accumulation) + 28 B update = 4·20 + 28 = 108 B
WEIGHT_TRAFFIC = 4 * (3 * 4 + 8) + 28
# residual path: 3·d fp32 elements per token and sublayer, forward and backward (3×)
IO_PER_TOKEN_SUBLAYER = 3 * 3 * 64 * 4


def test_param_count_is_the_hand_count() -> None:
    from cost_model import param_count

    assert param_count(TINY).total == PARAMS


def test_train_step_time_data_parallel() -> None:
    """One stage, 4-way data parallel: memory-bound, so the total is the memory time plus the
    ring all-reduce of the fp32 gradients, 2·(n − 1)/n × 4 × 105,024 bytes."""
    par = Parallelism(data=4)
    flops = 3 * FORWARD * TOKENS  # 83,558,400
    activations = 2 * 4 * (2 * ACT_BLOCK + ACT_EMBED + ACT_HEAD)  # written + read, m = 4
    bytes_moved = PARAMS * WEIGHT_TRAFFIC + activations + IO_PER_TOKEN_SUBLAYER * 4 * TOKENS
    assert bytes_moved == 15_197_952
    dp = 2 * 3 / 4 * 4 * PARAMS
    assert dp == 630_144
    t = train_step_time(TINY, WL, par, H100)
    assert t.compute_s == pytest.approx(flops / FP32_PEAK, rel=1e-12)
    assert t.memory_s == pytest.approx(bytes_moved / HBM, rel=1e-12)
    assert t.comm_s == pytest.approx(dp / LINK, rel=1e-12)
    assert t.bubble_s == 0
    assert t.memory_s > t.compute_s  # so a compute-only step time is caught
    assert t.total_s == pytest.approx(bytes_moved / HBM + dp / LINK, rel=1e-12)
    assert data_parallel_bytes_per_step(TINY, par) == pytest.approx(dp, rel=1e-12)
    assert price(TINY, WL, par, "h100").metrics()["dp_bytes_per_step"] == pytest.approx(dp)


def test_train_step_time_two_stages() -> None:
    """P = 2, m = 4, data = 4: the last stage (one block, the final norm, the tied head's copy
    of the embedding, the head's FLOPs and activations) is the slowest. Its busy time is the
    memory time; the bubble is (P − 1)/(V·m) = 1/4 of it; the pipeline hands the hidden state
    over once per micro-batch each way, 2·s·b·m·d·e bytes a step, half of it on this stage."""
    par = Parallelism(pipeline=2, data=4)
    last_params = BLOCK + 64 + 6_400  # 55,744 (stage 0: 49,280 + 6,400 = 55,680)
    flops = (3 * (FORWARD - HEAD) / 2 + 3 * HEAD) * TOKENS  # 345,600 per token
    activations = 2 * 4 * (ACT_BLOCK + ACT_HEAD)
    io = IO_PER_TOKEN_SUBLAYER * 2 * TOKENS
    bytes_moved = last_params * WEIGHT_TRAFFIC + activations + io
    assert bytes_moved == 8_098_048
    pp = 2 * TOKENS * 64 * 4 / 2
    dp = 2 * 3 / 4 * 4 * last_params
    t = train_step_time(TINY, WL, par, H100)
    assert t.compute_s == pytest.approx(flops / FP32_PEAK, rel=1e-12)
    assert t.memory_s == pytest.approx(bytes_moved / HBM, rel=1e-12)
    assert t.comm_s == pytest.approx((pp + dp) / LINK, rel=1e-12)
    assert t.bubble_s == pytest.approx(bytes_moved / HBM / 4, rel=1e-12)
    assert t.total_s == pytest.approx(bytes_moved / HBM * (1 + 1 / 4) + (pp + dp) / LINK, rel=1e-12)
    assert data_parallel_bytes_per_step(TINY, par) == pytest.approx(dp, rel=1e-12)
    assert data_parallel_bytes_per_step(TINY, par, stage=0) == pytest.approx(
        2 * 3 / 4 * 4 * (BLOCK + 6_400), rel=1e-12
    )


def test_step_time_pays_for_recomputation() -> None:
    """A compute-bound shape: full recomputation adds the blocks' forward to the step's FLOPs,
    selective the attention core's, so a search minimising step time no longer sees them as
    free. bf16 on H100 (989 TFLOP/s), L_b = 4, d = 2048, s = 2048, b = 8, 2048 + 8192 MLP."""
    cfg = ArchConfig(n_layers=4, d_model=2048, n_heads=16, seq_len=2048, dtype="bfloat16")
    wl = Workload(micro_batch=8, seq_len=2048)
    tokens = 2048 * 8
    h, s, layers, vocab = 2048, 2048, 4, 256
    block_forward = layers * (24 * h * h + 4 * s * h)
    head_forward = 2 * h * vocab
    plain = 3 * (block_forward + head_forward) * tokens
    times = {
        mode: train_step_time(cfg, wl.replace(recompute=mode), Parallelism(), H100)
        for mode in ("none", "selective", "full")
    }
    assert times["none"].compute_s == pytest.approx(plain / 989e12, rel=1e-12)
    assert times["full"].compute_s == pytest.approx(
        (plain + block_forward * tokens) / 989e12, rel=1e-12
    )
    assert times["selective"].compute_s == pytest.approx(
        (plain + layers * 4 * s * h * tokens) / 989e12, rel=1e-12
    )
    assert times["none"].compute_s > times["none"].memory_s  # compute-bound
    assert times["none"].total_s < times["selective"].total_s < times["full"].total_s


def test_decode_token_time_tensor_parallel() -> None:
    """t = 2, 3 sequences at context 16: FLOPs 3 × 217,600 / 2 (the vocabulary-parallel head
    split too); bytes: the weights one rank holds (matrices and embedding halved, norm gains
    whole: 49,152 + 3,200 + 4·64 + 64 = 52,672 fp32 values), its half of the KV cache
    2·L_b·kv·context·batch·e/2 = 24,576, and the residual path 3·d·e per sublayer and sequence,
    9,216; two all-reduces of 3·d·e = 768 bytes per block, 2·(t − 1)/t of it sent each."""
    par = Parallelism(tensor=2)
    flops = 3 * FORWARD / 2
    weights = (2 * (BLOCK - 128) / 2 + 2 * 128 + 6_400 / 2 + 64) * 4
    assert weights == 52_672 * 4
    kv = 2 * 2 * 64 * 16 * 3 * 4 / 2
    io = 3 * 64 * 4 * 4 * 3
    comm = 2 * 2 * (2 * 1 / 2 * 3 * 64 * 4)
    t = decode_token_time(TINY, WL, par, H100)
    assert t.compute_s == pytest.approx(flops / FP32_PEAK, rel=1e-12)
    assert t.memory_s == pytest.approx((weights + kv + io) / HBM, rel=1e-12)
    assert t.comm_s == pytest.approx(comm / LINK, rel=1e-12)
    assert t.bubble_s == 0
    assert t.memory_s > t.compute_s
    assert t.total_s == pytest.approx((weights + kv + io) / HBM + comm / LINK, rel=1e-12)


def test_decode_token_time_compute_bound() -> None:
    """When compute dominates (a device of 100 GFLOP/s against 1 TB/s; 64 sequences), the
    total is the compute time: the max of the two, not the memory time."""
    slow = Hardware("slow", {"float32": 100e9}, 1e12, memory_bytes=1e9, link_bandwidth=1e9)
    wl = WL.replace(decode_batch=64)
    t = decode_token_time(TINY, wl, Parallelism(), slow)
    flops = 64 * FORWARD
    bytes_moved = PARAMS * 4 + 2 * 2 * 64 * 16 * 64 * 4 + 3 * 64 * 4 * 4 * 64
    assert t.compute_s == pytest.approx(flops / 100e9, rel=1e-12)
    assert t.memory_s == pytest.approx(bytes_moved / 1e12, rel=1e-12)
    assert t.compute_s > t.memory_s
    assert t.total_s == pytest.approx(flops / 100e9, rel=1e-12)


def test_inference_memory_bf16_sharded() -> None:
    """bf16 weights (2 B each) of one tensor rank's shard, its share of the bf16 KV cache, and
    the prefill's residual stream (one source, sequence-sharded over the tensor ranks)."""
    cfg = TINY.replace(dtype="bfloat16")
    par = Parallelism(tensor=2)
    wl = Workload(decode_context=12, decode_batch=3, prefill_tokens=10)
    mem = inference_memory(cfg, wl, par)
    assert mem.weights_bytes == 52_672 * 2
    assert mem.kv_cache_bytes == 2 * 2 * 64 * 12 * 3 * 2 / 2
    assert mem.depth_cache_bytes == 1 * 10 * 64 * 2 / 2
    assert mem.total_bytes == 52_672 * 2 + 9_216 + 640
    # two pipeline stages: the last holds one block, the final norm and the head's copy
    staged = inference_memory(cfg, wl, Parallelism(pipeline=2))
    assert staged.weights_bytes == (BLOCK + 64 + 6_400) * 2
    assert staged.kv_cache_bytes == 2 * 2 * 64 * 12 * 3 * 2 / 2


def test_training_memory_tiny_by_hand() -> None:
    """No parallelism: 16 B per parameter and one micro-batch's activations."""
    mem = training_memory(TINY, WL)
    assert mem.weights_bytes + mem.gradient_bytes + mem.optimizer_bytes == 16 * PARAMS
    assert mem.activation_bytes == 2 * ACT_BLOCK + ACT_EMBED + ACT_HEAD


# -- what the formulas refuse --------------------------------------------------------------------
LEARNED = TINY.replace(positions="learned")


@pytest.mark.parametrize(
    ("field", "workload"),
    [
        ("prefill_tokens", Workload(prefill_tokens=17)),
        ("decode_context", Workload(decode_context=32)),
    ],
)
def test_learned_positions_refuse_longer_sequences(field: str, workload: Workload) -> None:
    with pytest.raises(CostInputError) as err:
        price(LEARNED, workload)
    assert err.value.field == field
    assert "seq_len = 16" in err.value.reason
    assert "learned positions" in err.value.reason
    price(TINY, workload)  # RoPE has no position table to run out of


def test_learned_positions_refuse_in_each_formula() -> None:
    with pytest.raises(CostInputError, match="prefill_tokens"):
        prefill_flops(LEARNED, 17)
    with pytest.raises(CostInputError, match="decode_context"):
        decode_flops_per_token(LEARNED, 17)
    with pytest.raises(CostInputError, match="decode_context"):
        inference_memory(LEARNED, Workload(decode_context=17))
    for refuses in (training_memory, inference_memory):
        with pytest.raises(CostInputError) as err:
            refuses(LEARNED, Workload(seq_len=17))
        assert err.value.field == "seq_len"
    for timed in (train_step_time, decode_token_time):
        with pytest.raises(CostInputError) as err:
            timed(LEARNED, Workload(seq_len=17), Parallelism(), H100)
        assert err.value.field == "seq_len"
    assert prefill_flops(LEARNED, 16) > 0  # exactly seq_len is allowed
    grid = ArchGrid.build(LEARNED, seq_len=np.array([16, 64]))
    with pytest.raises(CostInputError, match="1 grid points"):
        decode_flops_per_token(grid, 32)
