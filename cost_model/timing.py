"""Roofline time estimates of a training step and of one decoded token on a hardware preset."""

from __future__ import annotations

from typing import Any

from cost_model._config import _Derived
from cost_model._workload import (
    Parallelism,
    Workload,
    check_positions,
    distinct_stages,
    most_loaded,
)
from cost_model.comm import (
    allreduce_bytes,
    data_parallel_bytes_per_step,
    pipeline_comm,
    tensor_parallel_bytes_per_step,
)
from cost_model.flops import (
    decode_flops_per_token,
    forward_flops_per_token,
    stage_training_flops_per_token,
)
from cost_model.hardware import Hardware, RooflineTime, roofline
from cost_model.io import residual_io
from cost_model.memory import (
    kv_cache_bytes,
    microbatch_activation_bytes_by_stage,
    stage_param_counts,
)

#: AdamW update per parameter: read weight, gradient and two moments (16 B), write weight and
#: moments (12 B).
OPTIMIZER_TRAFFIC_BYTES = 28
#: Per micro-batch and parameter: the forward reads the weights once, the backward twice
#: (input and weight gradients), and the fp32 gradient is read and written once (accumulate).
WEIGHT_READS_PER_MICROBATCH = 3
GRADIENT_TRAFFIC_BYTES = 8


def train_step_time(
    cfg: _Derived, workload: Workload, parallel: Parallelism, hw: Hardware
) -> RooflineTime:
    """One optimizer step on one device of the slowest pipeline stage (1F1B runs at the pace
    of its slowest stage): the roofline (`hardware.roofline`) of each stage, the stage with the
    largest total chosen.

    FLOPs: the stage's hardware FLOPs per token (`flops.stage_training_flops_per_token`:
    L_b/P blocks with the recomputation the workload asks for, the LM head on the last stage,
    split over the t tensor ranks) × the step's s·b·m tokens.
    Bytes: per micro-batch the stage's weights read 3× at e bytes and its fp32 gradients read
    and written (8 B), the AdamW update (28 B per parameter), each activation of a micro-batch
    written once and read once (`memory.microbatch_activation_bytes_by_stage`), and the
    residual-path I/O (`io.residual_io`) of its 2·L_b/P sublayers for forward and backward (3×).
    Communication: tensor-parallel all-reduces, pipeline traffic with cross-stage caching (1/P
    of the step's, and 1/t of it per tensor rank: Narayanan et al. 2021 §4.1's scatter/gather,
    each rank of a stage sending its share), the data-parallel all-reduce of the stage's
    gradients, each on the network its group spans (`Hardware.network_for`), ranks placed
    tensor innermost, then data, then pipeline (Megatron-LM's order): a tensor group spans t
    consecutive ranks, a data-parallel group t·d (stride t), a pipeline t·d·p (stride t·d);
    each group's bytes over that network's bandwidth, plus its latency per message (ring
    steps, pipeline sends). Bubble:
    interleaved 1F1B, (P − 1)/(V·m) of the busy time.
    """
    s = workload.seq_len or cfg.seq_len
    check_positions(cfg, "seq_len", s)
    tokens = s * workload.micro_batch * workload.microbatches
    e = cfg.dtype_bytes
    params = stage_param_counts(cfg, parallel)
    flops = stage_training_flops_per_token(
        cfg, parallel.tensor, parallel.pipeline, workload.recompute, attended=s
    )
    activations = microbatch_activation_bytes_by_stage(cfg, workload, parallel)
    sublayers_here = cfg.n_sublayers / parallel.pipeline
    io_traffic = 3 * residual_io(cfg).bytes * sublayers_here * tokens
    pp = pipeline_comm(cfg, parallel, workload)
    t, p, d = parallel.tensor, parallel.pipeline, parallel.data
    tp_bytes = tensor_parallel_bytes_per_step(cfg, parallel, workload)
    # each of the t ranks of a stage sends 1/t of the hand-over (Narayanan et al. 2021 §4.1,
    # scatter/gather; with sequence parallelism the activations are already split so)
    pp_bytes = pp.cached_bytes_per_step / (p * t)
    tp_bw, tp_lat = hw.network_for(t)
    pp_bw, pp_lat = hw.network_for(t * d * p) if p > 1 else (hw.link_bandwidth, 0.0)
    dp_bw, dp_lat = hw.network_for(t * d)
    # messages per step and device: 4 ring all-reduces per block and micro-batch of
    # 2·(t − 1) steps each; a send and a receive of each chunk's hand-over per micro-batch;
    # 2·(d − 1) steps of the gradient ring
    tp_messages = 4 * cfg.n_layers / p * workload.microbatches * 2 * (t - 1)
    pp_messages = 2 * workload.microbatches * (parallel.chunks - 1) / p
    shared_s = (
        tp_bytes / tp_bw
        + tp_messages * tp_lat
        + pp_bytes / pp_bw
        + pp_messages * pp_lat
        + 2 * (d - 1) * dp_lat
    )
    stages = []
    for stage in distinct_stages(parallel.pipeline):  # stages 1 to P − 2 cost the same
        weight_traffic = params[stage] * (
            workload.microbatches * (WEIGHT_READS_PER_MICROBATCH * e + GRADIENT_TRAFFIC_BYTES)
            + OPTIMIZER_TRAFFIC_BYTES
        )
        activation_traffic = 2 * activations[stage] * workload.microbatches
        dp_bytes = data_parallel_bytes_per_step(cfg, parallel, stage)
        stages.append(
            roofline(
                flops[stage] * tokens,
                weight_traffic + activation_traffic + io_traffic,
                hw,
                cfg.dtype,
                comm_bytes=tp_bytes + pp_bytes + dp_bytes,
                bubble_fraction=pp.bubble_fraction,
                comm_s=shared_s + dp_bytes / dp_bw,
            )
        )
    return most_loaded(stages, lambda r: r.total_s)


def decode_token_time(
    cfg: _Derived, workload: Workload, parallel: Parallelism, hw: Hardware
) -> RooflineTime:
    """One decoding step for `decode_batch` sequences at `decode_context`, on one device of
    the slowest pipeline stage (with P stages, P groups of sequences in flight; one sequence's
    latency is the sum over the stages).

    The roofline of: FLOPs, the stage's L_b/P blocks at the context (and the LM head on the
    last stage) per sequence, split over the t tensor ranks; bytes, the stage's weights at e
    bytes and its share of the KV cache, 2·L_b·kv·context·batch·e/(t·P), read once per step,
    plus the residual-path I/O of its sublayers for every sequence; communication, two
    tensor-parallel all-reduces of batch·d·e bytes per block. No bubble term."""
    s = workload.seq_len or cfg.seq_len
    check_positions(cfg, "seq_len", s)
    context = workload.decode_context or s
    batch = workload.decode_batch
    t, p = parallel.tensor, parallel.pipeline
    fwd = forward_flops_per_token(cfg, attended=context)
    per_token = decode_flops_per_token(cfg, context)
    body = (per_token - fwd.lm_head_flops) / (t * p)
    kv = kv_cache_bytes(cfg, context, batch, t * p)
    io_traffic = residual_io(cfg).bytes * cfg.n_sublayers / p * batch
    message = batch * cfg.d_model * cfg.dtype_bytes
    comm: Any = 2 * cfg.n_layers / p * allreduce_bytes(message, t)
    tp_bw, tp_lat = hw.network_for(t)
    comm_s = comm / tp_bw + 2 * cfg.n_layers / p * 2 * (t - 1) * tp_lat
    counts = stage_param_counts(cfg, parallel)
    stages = []
    for stage in distinct_stages(p):  # stages 1 to P − 2 cost the same
        params = counts[stage]
        flops = body + (fwd.lm_head_flops / t if stage == p - 1 else 0)
        weights = params * cfg.dtype_bytes
        stages.append(
            roofline(
                flops * batch,
                weights + kv + io_traffic,
                hw,
                cfg.dtype,
                comm_bytes=comm,
                comm_s=comm_s,
            )
        )
    return most_loaded(stages, lambda r: r.total_s)
