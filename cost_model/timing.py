"""Roofline time estimates of a training step and of one decoded token on a hardware preset."""

from __future__ import annotations

from typing import Any

from cost_model._config import _Derived
from cost_model._workload import Parallelism, Workload
from cost_model.comm import (
    allreduce_bytes,
    data_parallel_bytes_per_step,
    pipeline_comm,
    tensor_parallel_bytes_per_step,
)
from cost_model.flops import decode_flops_per_token, training_flops_per_token
from cost_model.hardware import Hardware, RooflineTime, roofline
from cost_model.io import residual_io
from cost_model.memory import kv_cache_bytes, training_memory
from cost_model.params import param_count

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
    """One optimizer step on one device.

    FLOPs: training FLOPs per token × the step's tokens, split over tensor × pipeline ranks.
    Bytes: weight reads and gradient accumulation per micro-batch, the AdamW update, each saved
    activation written once and read once, and the residual-path I/O (`io.residual_io`) of
    every sublayer for forward and backward (3×).
    Communication: tensor-parallel all-reduces, pipeline traffic with cross-stage caching, the
    data-parallel gradient all-reduce. Bubble: interleaved 1F1B.
    """
    s = workload.seq_len or cfg.seq_len
    tokens = s * workload.micro_batch * workload.microbatches
    model_shards = parallel.tensor * parallel.pipeline
    flops = training_flops_per_token(cfg, attended=s) * tokens / model_shards
    shard = param_count(cfg).total / model_shards
    e = cfg.dtype_bytes
    mem = training_memory(cfg, workload, parallel)
    weight_traffic = shard * (
        workload.microbatches * (WEIGHT_READS_PER_MICROBATCH * e + GRADIENT_TRAFFIC_BYTES)
        + OPTIMIZER_TRAFFIC_BYTES
    )
    activation_traffic = 2 * mem.activation_bytes * workload.microbatches
    sublayers_here = cfg.n_sublayers / parallel.pipeline
    io_traffic = 3 * residual_io(cfg).bytes * sublayers_here * tokens
    pp = pipeline_comm(cfg, parallel, workload)
    comm = (
        tensor_parallel_bytes_per_step(cfg, parallel, workload)
        + pp.cached_bytes_per_step / parallel.pipeline
        + data_parallel_bytes_per_step(cfg, parallel)
    )
    return roofline(
        flops,
        weight_traffic + activation_traffic + io_traffic,
        hw,
        cfg.dtype,
        comm_bytes=comm,
        bubble_fraction=pp.bubble_fraction,
    )


def decode_token_time(
    cfg: _Derived, workload: Workload, parallel: Parallelism, hw: Hardware
) -> RooflineTime:
    """One decoding step for `decode_batch` sequences at `decode_context`.

    Memory-bound in practice: every weight and the whole KV cache are read once per step, plus
    the residual-path I/O of every sublayer for every sequence; two tensor-parallel
    all-reduces per block."""
    s = workload.seq_len or cfg.seq_len
    context = workload.decode_context or s
    batch = workload.decode_batch
    model_shards = parallel.tensor * parallel.pipeline
    flops = decode_flops_per_token(cfg, context) * batch / model_shards
    weights = param_count(cfg).total * cfg.dtype_bytes / model_shards
    kv = kv_cache_bytes(cfg, context, batch, model_shards)
    io_traffic = residual_io(cfg).bytes * cfg.n_sublayers / parallel.pipeline * batch
    message = batch * cfg.d_model * cfg.dtype_bytes
    comm: Any = 2 * cfg.n_layers / parallel.pipeline * allreduce_bytes(message, parallel.tensor)
    return roofline(flops, weights + kv + io_traffic, hw, cfg.dtype, comm_bytes=comm)
