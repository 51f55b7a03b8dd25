"""Training and inference memory, in bytes.

Training activations follow Korthikanti et al. 2022, *Reducing Activation Recomputation in
Large Transformer Models* (arXiv 2205.05198), §4: with 16-bit activations, 1-byte dropout
masks and an unfused attention, one Transformer block saves s·b·h·(34 + 5·a·s/h) bytes. The
formula here is written term by term so that it also covers other settings (fp32, no dropout,
fused attention, grouped KV heads, SwiGLU, norm statistics) and reduces to theirs.

All functions accept an `ArchConfig` (ints) or an `ArchGrid` (arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np

from cost_model._config import _Derived
from cost_model._workload import (
    Parallelism,
    Workload,
    check_positions,
    distinct_stages,
    most_loaded,
)
from cost_model.depth import cached_sources, live_sources
from cost_model.params import norm_params, param_count
from cost_model.residuals import residual_of

#: AdamW training with fp32 master weights: 4 (weights) + 4 (gradients) + 8 (two moments)
#: bytes per parameter (Rajbhandari et al. 2020, ZeRO, §3.1; the same 16 B under autocast).
WEIGHT_BYTES = 4
GRADIENT_BYTES = 4
ADAMW_STATE_BYTES = 8
FP32 = 4


@dataclass(frozen=True)
class ActivationSettings:
    """How activations are stored.

    act_bytes: bytes per activation element (None: the architecture's dtype).
    dropout: dropout after the embedding, after attention probabilities and after each
        sublayer (1-byte masks).
    fused_attention: a flash/SDPA kernel that keeps no s×s matrix (it saves Q, K, V, its
        output — the output projection's input, one tensor — and one fp32 log-sum-exp per
        query row and head).
    norm_stats: count what a norm saves beyond its input: the per-row fp32 statistics
        (RMSNorm 1/rms, LayerNorm mean and 1/std) and, for an RMSNorm with a gain, the
        normalised tensor before the gain (the gain's product keeps it). Korthikanti et al.
        leave these out.
    """

    act_bytes: int | None = None
    dropout: bool = False
    fused_attention: bool = True
    norm_stats: bool = True

    @classmethod
    def korthikanti(cls) -> ActivationSettings:
        """The setting of Korthikanti et al. 2022: 16-bit, dropout, unfused, no norm stats."""
        return cls(act_bytes=2, dropout=True, fused_attention=False, norm_stats=False)


@dataclass(frozen=True)
class BlockActivations:
    """Bytes one Transformer block saves for its backward pass, per micro-batch."""

    replicated_bytes: Any  # norm inputs, QKV/MLP inputs, dropout masks (sharded only with SP)
    sharded_bytes: Any  # Q, K, V, attention output, MLP hidden: split over tensor ranks
    attention_core_bytes: Any  # softmax / dropout over s×s, or the fused kernel's extras

    @property
    def total_bytes(self) -> Any:
        return self.replicated_bytes + self.sharded_bytes + self.attention_core_bytes


@dataclass(frozen=True)
class TrainingMemory:
    """Peak training memory per device, in bytes, of one pipeline stage (`stage`); from
    `training_memory`, the most loaded stage's."""

    weights_bytes: Any
    gradient_bytes: Any
    optimizer_bytes: Any
    activation_bytes: Any  # saved for backward: blocks + depth mixing + head
    depth_mixing_activation_bytes: Any  # the residual wiring's share of activation_bytes
    depth_sources_live_bytes: Any  # forward working set of depth sources (informative)
    stage: Any = 0  # the pipeline stage these figures are of (0-based): the most loaded one

    @property
    def total_bytes(self) -> Any:
        return (
            self.weights_bytes + self.gradient_bytes + self.optimizer_bytes + self.activation_bytes
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activation_bytes": self.activation_bytes,
            "depth_mixing_activation_bytes": self.depth_mixing_activation_bytes,
            "depth_sources_live_bytes": self.depth_sources_live_bytes,
            "stage": self.stage,
            "total_bytes": self.total_bytes,
        }


def _norm_extra_bytes(cfg: _Derived, e: int, tokens: Any) -> Any:
    """What one norm saves beyond its input, for `tokens` rows (see `ActivationSettings`)."""
    if cfg.norm == "layernorm":
        return 2 * FP32 * tokens
    return (FP32 + e * cfg.d_model) * tokens


def block_activations(
    cfg: _Derived,
    micro_batch: Any,
    seq_len: Any,
    recompute: str = "none",
    settings: ActivationSettings | None = None,
    tensor: int = 1,
    sequence_parallel: bool = False,
) -> BlockActivations:
    """Activation bytes of one Transformer block (attention + MLP sublayer, PreNorm).

    Terms per micro-batch (s tokens, b sequences, width h = d, e bytes per element, m = 1 with
    dropout, a heads, kv = K/V width, f = MLP hidden width), following Korthikanti et al. §4.1:
      replicated: two norm inputs 2·e·sbh, QKV input e·sbh, MLP input e·sbh, two dropout
                  masks 2·m·sbh  (= 10·sbh in their setting)
      sharded:    Q and K e·sb(h + kv), V e·sb·kv, output-projection input e·sbh,
                  MLP hidden 2·e·sbf (GELU input and output) or 4·e·sbf (SwiGLU: gate, up,
                  SiLU output, product)  (= 24·sbh in their setting)
      core:       unfused: softmax output e·as²b, with dropout its mask m·as²b and output
                  e·as²b  (= 5·as²b); fused: the fp32 log-sum-exp 4·asb (its output is the
                  output projection's input, already counted).
    Tensor parallelism t divides the sharded and core terms; sequence parallelism also the
    replicated ones: s·b·h·(10 + 24/t + 5as/(ht)) and s·b·h·(34/t + 5as/(ht)).
    Selective recomputation drops the unfused core; full recomputation keeps only the block
    input e·sbh (divided by t with sequence parallelism).
    """
    settings = settings or ActivationSettings()
    e = settings.act_bytes or cfg.dtype_bytes
    m = 1 if settings.dropout else 0
    sb = seq_len * micro_batch
    d, kv, f, a = cfg.d_model, cfg.kv_dim, cfg.ffn_dim, cfg.n_heads
    rep_div = tensor if sequence_parallel else 1
    if recompute == "full":
        return BlockActivations(e * sb * d / rep_div, 0 * d, 0 * d)
    stats = 2 * _norm_extra_bytes(cfg, e, sb) if settings.norm_stats else 0
    replicated = 2 * e * sb * d + stats + e * sb * d + e * sb * d + 2 * m * sb * d
    hidden = (4 if cfg.mlp == "swiglu" else 2) * e * sb * f
    sharded = e * sb * (d + kv) + e * sb * kv + e * sb * d + hidden
    if settings.fused_attention:
        core = FP32 * a * sb + 0 * d
    elif recompute == "selective":
        core = 0 * d
    else:
        per_score = e + ((m + e) if settings.dropout else 0)  # probabilities (+ mask, output)
        core = per_score * a * seq_len * sb
    return BlockActivations(replicated / rep_div, sharded / tensor, core / tensor)


def depth_mixing_activation_bytes(
    cfg: _Derived,
    micro_batch: Any,
    seq_len: Any,
    recompute: str = "none",
    act_bytes: int | None = None,
) -> Any:
    """Bytes the residual wiring saves for backward, beyond what a standard residual saves, as
    the variant counts them (`Residual.mixing_activation_bytes`, each with its terms):

    - AttnRes: the L + 1 distinct sources with their fp32 key scales, the depth stack's fp32
      weights per (use, source) and Block's partials' logits (the input-dependent query: per
      use its logits and weights, plus 3·e·d + a 1/rms per sublayer); with full recomputation
      only the values (the checkpoint inputs) stay.
    - mHC-lite, per sublayer: the n·d stream state, the sublayer output and
      k + 3n + n! + n² + 1 fp32 coefficient values per token.
    - DenseFormer: every block output before its weighted average (e·d per block).
    """
    e = act_bytes or cfg.dtype_bytes
    return residual_of(cfg).mixing_activation_bytes(cfg, seq_len * micro_batch, e, recompute)


def head_activation_bytes(
    cfg: _Derived,
    micro_batch: Any,
    seq_len: Any,
    settings: ActivationSettings | None = None,
    tensor: int = 1,
    sequence_parallel: bool = False,
) -> Any:
    """What the last pipeline stage saves after the blocks, per micro-batch: the final norm's
    input (+ its extras) and the LM head's input, 2·e·sbh (divided by t with sequence
    parallelism, as the blocks' replicated terms), the fp32 log-softmax of the loss 4·sbV
    (vocabulary-parallel cross-entropy: split over the t ranks, Shoeybi et al. 2019 §3), and
    the int64 targets 8·sb.

    Megatron-LM's estimator counts the same 4·sbh·(1 + V/h) bytes at e = 2
    (`compute_activation_memory`, "inputs to output layer and CE loss")."""
    settings = settings or ActivationSettings()
    e = settings.act_bytes or cfg.dtype_bytes
    sb = seq_len * micro_batch
    rep_div = tensor if sequence_parallel else 1
    stats = _norm_extra_bytes(cfg, e, sb) if settings.norm_stats else 0
    targets = 8 * sb
    return (
        (2 * e * sb * cfg.d_model + stats) / rep_div + FP32 * sb * cfg.vocab_size / tensor + targets
    )


def embedding_activation_bytes(
    cfg: _Derived,
    micro_batch: Any,
    seq_len: Any,
    settings: ActivationSettings | None = None,
    tensor: int = 1,
    sequence_parallel: bool = False,
) -> Any:
    """What the first pipeline stage saves before the blocks, per micro-batch: the int64 token
    ids 8·sb and, with dropout, the embedding dropout's 1-byte mask sbh (divided by t with
    sequence parallelism). Megatron-LM's estimator: 8·s·b + s·b·h per micro-batch in flight
    ("input to embedding", "dropout in embedding layer")."""
    settings = settings or ActivationSettings()
    sb = seq_len * micro_batch
    rep_div = tensor if sequence_parallel else 1
    mask = sb * cfg.d_model / rep_div if settings.dropout else 0 * cfg.d_model
    return 8 * sb + mask


def stage_param_counts(cfg: _Derived, parallel: Parallelism | None = None) -> list[Any]:
    """Parameters one device of each pipeline stage holds, stage 0 first.

    The L_b blocks are split evenly over the P stages (L_b/P each, a fraction when P does not
    divide L_b). Megatron-LM's layout: the matrices (attention and MLP projections, their
    biases) and the vocabulary-parallel embedding and head are split over the t tensor ranks
    (Shoeybi et al. 2019, §3); the norm gains, learned positions and the residual wiring's own
    parameters act on the replicated residual stream and are replicated. Stage 0 holds the
    token (and position) embedding; the last stage the final norm, the AttnRes output
    aggregation and the LM head, which with tied embeddings and P > 1 is a second copy of the
    embedding (Megatron-LM keeps one on the last stage and all-reduces the two gradients).
    The residual wiring's per-sublayer parameters sit with their sublayers: 1/P per stage.

    Megatron-LM's `compute_weight_and_optimizer_memory` takes stage 0 as the most loaded:
    (blocks/P + V·h)/t, plus V·h/t for an untied head when P = 1."""
    parallel = parallel or Parallelism()
    p, t = parallel.pipeline, parallel.tensor
    counts = param_count(cfg)
    norms_per_block = 2 * norm_params(cfg, cfg.d_model)
    matrices = counts.attention + counts.mlp
    per_stage = (matrices / t + cfg.n_layers * norms_per_block + counts.depth_mixing) / p
    embedding = counts.embedding / t + counts.positions
    final = norm_params(cfg, cfg.d_model) + counts.depth_aggregation
    head = (counts.embedding if cfg.tie_embeddings else counts.lm_head) / t
    if p == 1:
        untied = 0 * head if cfg.tie_embeddings else head
        return [per_stage + embedding + final + untied]
    middle = per_stage + 0 * embedding  # stages 1 to P − 2, one shared (never mutated) value
    stages = [middle] * p
    stages[0] = stages[0] + embedding
    stages[-1] = stages[-1] + final + head
    return stages


def _stage_activations(
    cfg: _Derived,
    workload: Workload,
    parallel: Parallelism,
    settings: ActivationSettings,
    stage: int,
    chunks: int,
) -> tuple[Any, Any]:
    """(activation bytes, the residual wiring's share) of stage `stage` holding `chunks` model
    chunks' activations (`Parallelism.in_flight_chunks`): chunks·L_b/(P·V) blocks, the
    residual wiring's saved tensors in the same share (1/(P·V) of the model's per chunk), the
    embedding's on stage 0 for chunks/V micro-batches, the head's on the last stage for one
    (it holds a single micro-batch's at its peak). A later stage of an AttnRes or DenseFormer
    pipeline also keeps the depth sources it received for their backward; they are not
    counted here (the cross-stage traffic is, in `comm.pipeline_comm`)."""
    s = workload.seq_len or cfg.seq_len
    b = workload.micro_batch
    t, sp = parallel.tensor, parallel.sequence_parallel
    per_block = block_activations(cfg, b, s, workload.recompute, settings, t, sp).total_bytes
    mixing_all = depth_mixing_activation_bytes(cfg, b, s, workload.recompute, settings.act_bytes)
    share = chunks / parallel.chunks
    blocks = share * cfg.n_layers * per_block
    mixing = share * mixing_all
    total = blocks + mixing
    if stage == 0:
        micro_batches = chunks / parallel.virtual
        total = total + micro_batches * embedding_activation_bytes(cfg, b, s, settings, t, sp)
    if stage == parallel.pipeline - 1:
        total = total + head_activation_bytes(cfg, b, s, settings, t, sp)
    return total, mixing


def microbatch_activation_bytes_by_stage(
    cfg: _Derived,
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    settings: ActivationSettings | None = None,
) -> list[Any]:
    """Activation bytes each pipeline stage saves for one micro-batch (its V chunks, L_b/P
    blocks, the embedding's on stage 0 and the head's on the last), stage 0 first: what a
    micro-batch writes once and reads once per stage. Stages 1 to P − 2 share one value."""
    workload = workload or Workload()
    parallel = parallel or Parallelism()
    settings = settings or ActivationSettings()
    p = parallel.pipeline
    by_stage = {
        stage: _stage_activations(cfg, workload, parallel, settings, stage, parallel.virtual)[0]
        for stage in distinct_stages(p)
    }
    return [by_stage[stage if stage in by_stage else 1] for stage in range(p)]


def _stages_memory(
    cfg: _Derived,
    workload: Workload | None,
    parallel: Parallelism | None,
    settings: ActivationSettings | None,
    stages: list[int] | None,
) -> list[TrainingMemory]:
    """`TrainingMemory` of the pipeline stages `stages` (None: every stage), in that order."""
    workload = workload or Workload()
    parallel = parallel or Parallelism()
    settings = settings or ActivationSettings()
    s = workload.seq_len or cfg.seq_len
    check_positions(cfg, "seq_len", s)
    e = settings.act_bytes or cfg.dtype_bytes
    live = e * live_sources(cfg) * cfg.d_model * s * workload.micro_batch
    counts = stage_param_counts(cfg, parallel)
    out = []
    for stage in range(parallel.pipeline) if stages is None else stages:
        params = counts[stage]
        chunks = parallel.in_flight_chunks(stage, workload.microbatches)
        activations, mixing = _stage_activations(cfg, workload, parallel, settings, stage, chunks)
        out.append(
            TrainingMemory(
                weights_bytes=WEIGHT_BYTES * params,
                gradient_bytes=GRADIENT_BYTES * params,
                optimizer_bytes=ADAMW_STATE_BYTES * params,
                activation_bytes=activations,
                depth_mixing_activation_bytes=mixing,
                depth_sources_live_bytes=live,
                stage=stage if np.ndim(params) == 0 else np.full(np.shape(params), stage),
            )
        )
    return out


def training_memory_by_stage(
    cfg: _Derived,
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    settings: ActivationSettings | None = None,
) -> list[TrainingMemory]:
    """Peak training memory of one device of every pipeline stage, stage 0 first.

    Weights, gradients and optimizer state: 4 + 4 + 8 B per parameter the stage holds
    (`stage_param_counts`). Activations: the stage's in-flight chunks under 1F1B
    (`Parallelism.in_flight_chunks`) of `block_activations`, the residual wiring's saved
    tensors, the embedding's (stage 0) and the head's (last stage). With V = 1 and m ≥ P,
    stage 0 holds P micro-batches of L_b/P blocks: L_b blocks' worth (Korthikanti et al.
    §4.2.3)."""
    return _stages_memory(cfg, workload, parallel, settings, None)


def training_memory(
    cfg: _Derived,
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    settings: ActivationSettings | None = None,
) -> TrainingMemory:
    """Peak memory of one device training with AdamW: that of the most loaded pipeline stage
    (`training_memory_by_stage`, the stage with the largest total; `stage` says which), found
    among the stages that can be it (`_workload.distinct_stages`: the first, the second and
    the last).

    Without pipelining: 16 B per parameter over the tensor ranks' shards, L_b blocks of
    `block_activations`, the residual wiring's saved tensors, the embedding's and the head's.
    """
    p = (parallel or Parallelism()).pipeline
    stages = _stages_memory(cfg, workload, parallel, settings, distinct_stages(p))
    return most_loaded(stages, lambda m: m.total_bytes)


@dataclass(frozen=True)
class InferenceMemory:
    """Inference memory per device, in bytes."""

    weights_bytes: Any
    kv_cache_bytes: Any
    depth_cache_bytes: Any

    @property
    def total_bytes(self) -> Any:
        return self.weights_bytes + self.kv_cache_bytes + self.depth_cache_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "depth_cache_bytes": self.depth_cache_bytes,
            "total_bytes": self.total_bytes,
        }


def kv_cache_bytes(cfg: _Derived, context: Any, batch: Any = 1, shards: int = 1) -> Any:
    """K and V for every block: 2·L_b·kv·context·batch·e, split over `shards` devices."""
    return 2 * cfg.n_layers * cfg.kv_dim * context * batch * cfg.dtype_bytes / shards


def prefill_depth_cache_bytes(
    cfg: _Derived, tokens: Any, shards: int = 1, chunk: Any = None
) -> Any:
    """Depth representations held during a prefill (Attention Residuals §4).

    Block AttnRes keeps its N block representations for every token: N·T·d elements (≈ 15 GB
    at T = 128K, N = 8, d = 7168, bf16). Sharding the sequence over P devices divides it by P;
    a chunked prefill keeps only the current chunk's: N·(chunk/P)·d. Other variants hold
    `depth.cached_sources` (Full L, DenseFormer L_b, mHC n, baseline 1) the same way.
    """
    held = tokens if chunk is None else chunk
    return cached_sources(cfg) * held * cfg.d_model * cfg.dtype_bytes / shards


def largest_stage_params(cfg: _Derived, parallel: Parallelism | None = None) -> Any:
    """Parameters on one device of the pipeline stage that holds the most
    (`stage_param_counts`)."""
    return reduce(np.maximum, stage_param_counts(cfg, parallel))


def inference_memory(
    cfg: _Derived, workload: Workload | None = None, parallel: Parallelism | None = None
) -> InferenceMemory:
    """Per device: the weights of the stage holding the most parameters
    (`stage_param_counts`), in the compute dtype (e bytes each), + the KV cache at the decode
    context, 2·L_b·kv·context·batch·e/(t·P), + the prefill's depth cache, sequence-sharded
    over the tensor-parallel group. A prefill or decode context longer than a learned position
    table is refused (`check_positions`)."""
    workload = workload or Workload()
    parallel = parallel or Parallelism()
    s = workload.seq_len or cfg.seq_len
    check_positions(cfg, "prefill_tokens", workload.prefill_tokens)
    check_positions(cfg, "decode_context", workload.decode_context)
    check_positions(cfg, "seq_len", s)
    context = workload.decode_context or s
    tokens = workload.prefill_tokens or s
    shards = parallel.tensor * parallel.pipeline
    return InferenceMemory(
        weights_bytes=largest_stage_params(cfg, parallel) * cfg.dtype_bytes,
        kv_cache_bytes=kv_cache_bytes(cfg, context, workload.decode_batch, shards),
        depth_cache_bytes=prefill_depth_cache_bytes(
            cfg, tokens, parallel.tensor, workload.prefill_chunk
        ),
    )


__all__ = [
    "ActivationSettings",
    "BlockActivations",
    "InferenceMemory",
    "TrainingMemory",
    "block_activations",
    "depth_mixing_activation_bytes",
    "embedding_activation_bytes",
    "head_activation_bytes",
    "inference_memory",
    "kv_cache_bytes",
    "largest_stage_params",
    "microbatch_activation_bytes_by_stage",
    "prefill_depth_cache_bytes",
    "stage_param_counts",
    "training_memory",
    "training_memory_by_stage",
]
