"""Communication: pipeline-parallel depth traffic, the pipeline bubble, tensor- and
data-parallel collectives. Bytes, per device unless stated otherwise.

Pipeline traffic of AttnRes follows Attention Residuals §4 (cross-stage caching): with P
physical stages, V virtual stages per rank, C = P·V chunks and N_p depth representations
produced per chunk, sending every earlier representation at every transition costs
Σ_{j=1}^{C−1} j·N_p·d = C(C−1)/2·N_p·d per token; when each rank caches what it has received,
P(P−1)/2·N_p·d + (V−1)·P²·N_p·d, and the peak per transition falls from (C−1)·N_p·d to P·N_p·d.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np

from cost_model._config import _Derived
from cost_model._workload import Parallelism, Workload
from cost_model.memory import stage_param_counts
from cost_model.residuals import residual_of

GRADIENT_BYTES = 4  # fp32 gradients are all-reduced


@dataclass(frozen=True)
class PipelineComm:
    """Pipeline-parallel traffic of one token's activations (forward direction), the same
    again for gradients in the backward pass, and per optimizer step (both directions)."""

    transitions: int  # C − 1 stage-to-stage hand-overs per micro-batch
    naive_bytes_per_token: Any
    cached_bytes_per_token: Any
    naive_peak_bytes_per_token: Any  # the largest single transition
    cached_peak_bytes_per_token: Any
    naive_bytes_per_step: Any
    cached_bytes_per_step: Any
    bubble_fraction: float
    first_boundary_sources: Any = 0  # d-vectors per token crossing the first stage boundary
    first_boundary_bytes_per_microbatch: Any = 0  # those for one micro-batch, one direction

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def pp_naive_elements(chunks: int, per_chunk: Any) -> Any:
    """Σ_{j=1}^{C−1} j·N_p = C(C−1)/2·N_p d-vectors per token: every transition re-sends
    every representation produced so far."""
    return chunks * (chunks - 1) / 2 * per_chunk


def pp_cached_elements(stages: int, virtual: int, per_chunk: Any) -> Any:
    """P(P−1)/2·N_p + (V−1)·P²·N_p d-vectors per token: the first round sends the growing
    prefix once; in every later round each transition carries only what the receiving rank
    has not cached, at most P chunks' worth."""
    return stages * (stages - 1) / 2 * per_chunk + (virtual - 1) * stages * stages * per_chunk


def pipeline_bubble_fraction(stages: int, virtual: int, microbatches: int) -> float:
    """Idle time over ideal compute time of interleaved 1F1B: (P−1)/(V·m)
    (Narayanan et al. 2021, *Efficient Large-Scale Language Model Training on GPU Clusters*,
    §2.2.2)."""
    return (stages - 1) / (virtual * microbatches)


def boundary_sources(cfg: _Derived, blocks_before: Any) -> Any:
    """d-vectors per token that cross a stage boundary after `blocks_before` Transformer
    blocks, counted exactly (not averaged over chunks), as the variant says
    (`Residual.boundary_sources`): the standard residual's hidden state, mHC-lite's n
    streams; Block AttnRes's embedding, finished blocks and the partial sum of a block the
    boundary cuts; Full AttnRes's embedding and every sublayer output; DenseFormer's embedding
    and every block output."""
    return residual_of(cfg).boundary_sources(cfg, blocks_before)


def pipeline_comm(
    cfg: _Derived, parallel: Parallelism, workload: Workload | None = None
) -> PipelineComm:
    """Stage-to-stage traffic for the residual wiring of `cfg`, from what the variant hands
    over (`Residual.pipeline_payload`).

    Depth representations (AttnRes, DenseFormer's block outputs: N_p per chunk) are sent naive
    or cached as in the module docstring. A carried state (a standard residual's hidden state,
    mHC-lite's n streams) crosses every transition once; caching changes nothing for it.
    """
    workload = workload or Workload()
    p, v, c = parallel.pipeline, parallel.virtual, parallel.chunks
    d, e = cfg.d_model, cfg.dtype_bytes
    per_chunk, state = residual_of(cfg).pipeline_payload(cfg, c)
    handed_over = c - 1  # transitions, each carrying the state once
    naive = pp_naive_elements(c, per_chunk) + handed_over * state
    cached = pp_cached_elements(p, v, per_chunk) + handed_over * state
    state_peak = state if c > 1 else 0 * state
    naive_peak = (c - 1) * per_chunk + state_peak
    cached_peak = (p if v > 1 else p - 1) * per_chunk + state_peak
    s = workload.seq_len or cfg.seq_len
    tokens_per_step = s * workload.micro_batch * workload.microbatches
    both_directions = 2  # activations forward, their gradients backward
    first = boundary_sources(cfg, cfg.n_layers // c) if c > 1 else 0 * cfg.n_layers
    microbatch_tokens = s * workload.micro_batch
    return PipelineComm(
        transitions=c - 1,
        naive_bytes_per_token=naive * d * e,
        cached_bytes_per_token=cached * d * e,
        naive_peak_bytes_per_token=naive_peak * d * e,
        cached_peak_bytes_per_token=cached_peak * d * e,
        naive_bytes_per_step=both_directions * tokens_per_step * naive * d * e,
        cached_bytes_per_step=both_directions * tokens_per_step * cached * d * e,
        bubble_fraction=pipeline_bubble_fraction(p, v, workload.microbatches),
        first_boundary_sources=first,
        first_boundary_bytes_per_microbatch=first * microbatch_tokens * d * e,
    )


def allreduce_bytes(message_bytes: Any, ranks: int) -> Any:
    """Bytes each rank sends in a ring all-reduce: 2·(t−1)/t × the message
    (Patarasuk & Yuan 2009). A reduce-scatter plus an all-gather (sequence parallelism) move
    the same."""
    return 2 * (ranks - 1) / ranks * message_bytes


def tensor_parallel_bytes_per_step(
    cfg: _Derived, parallel: Parallelism, workload: Workload | None = None
) -> Any:
    """Megatron-LM tensor parallelism: per block two all-reduces of the b·s·d activations in
    the forward pass and two in the backward (Shoeybi et al. 2019, §3), for the L_b/P blocks
    of one pipeline stage and every micro-batch of the step."""
    workload = workload or Workload()
    s = workload.seq_len or cfg.seq_len
    message = workload.micro_batch * s * cfg.d_model * cfg.dtype_bytes
    blocks = cfg.n_layers / parallel.pipeline
    return 4 * blocks * workload.microbatches * allreduce_bytes(message, parallel.tensor)


def data_parallel_bytes_per_step(
    cfg: _Derived, parallel: Parallelism, stage: int | None = None
) -> Any:
    """Gradient all-reduce over the data-parallel group of n = `parallel.data` ranks: the fp32
    gradients of the parameters one device holds (`memory.stage_param_counts`), 4 B each, in a
    ring: 2·(n − 1)/n × 4 × parameters bytes sent per device. `stage` picks a pipeline stage;
    by default the stage holding the most parameters."""
    counts = stage_param_counts(cfg, parallel)
    params = reduce(np.maximum, counts) if stage is None else counts[stage]
    return allreduce_bytes(GRADIENT_BYTES * params, parallel.data)
