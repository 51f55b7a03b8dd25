"""Floating-point operations per token.

Convention: a multiply-add counts 2 FLOPs; only matrix products and the depth contractions
(weighted sums and logits over depth sources) are counted. Element-wise work (norms,
activations, softmax, residual adds, RoPE) is left out, as in Kaplan et al. 2020 (arXiv
2001.08361, Table 1) and Chinchilla (arXiv 2203.15556, App. F). This is also what
`torch.utils.flop_counter.FlopCounterMode` counts, so the two can be compared term by term.

The backward pass costs twice the forward (one product for the input gradient, one for the
weight gradient), so a training step is 3× the forward: training ≈ 6·N·D + the attention term.
These are *model FLOPs*. Activation recomputation runs part of the forward again: the device's
*hardware FLOPs* add it (`recompute_flops_per_token`; the two terms as in Chowdhery et al.
2022, *PaLM*, arXiv 2204.02311, App. B: model FLOPs utilisation against hardware FLOPs
utilisation).

All functions accept an `ArchConfig` (ints) or an `ArchGrid` (arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cost_model._config import CostInputError, _Derived
from cost_model._workload import RECOMPUTE_MODES, check_positions
from cost_model.residuals import residual_of

BACKWARD_FACTOR = 2  # backward = 2 × forward for every matrix product


@dataclass(frozen=True)
class FlopsBreakdown:
    """Forward FLOPs per token, per component."""

    attention_proj_flops: Any  # Q, K, V, O projections
    attention_core_flops: Any  # Q·Kᵀ and A·V: the term quadratic in the context
    mlp_flops: Any
    lm_head_flops: Any
    depth_mixing_flops: Any  # residual wiring: depth attention, mHC mixing, DWA

    @property
    def total_flops(self) -> Any:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def static_flops(self) -> Any:
        """Everything that does not depend on the attended context."""
        return self.total_flops - self.attention_core_flops

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total_flops"] = self.total_flops
        return out


def attention_core_flops_per_token(cfg: _Derived, attended: Any) -> Any:
    """Q·Kᵀ (2·attended·d) and A·V (2·attended·d) per block: 4·L_b·attended·d.

    `attended` is the number of positions one query attends to. Training on full sequences
    with the product computed as a dense s×s matrix (what a FLOP counter sees) uses
    attended = s; the useful causal work averages (s + 1)/2."""
    return 4 * cfg.n_layers * attended * cfg.d_model


def depth_mixing_flops_per_token(cfg: _Derived) -> Any:
    """Forward FLOPs per token of the residual wiring, as the variant counts them
    (`Residual.mixing_flops`, each with its formula):

    - AttnRes (Full, Block, ablations): 4·d·Σk over the sources k each sublayer attends to,
      plus the output aggregation (O(L²·d) for Full, O(L·N·d) for Block); the input-dependent
      query adds its d×d projection, 2·d² per sublayer.
    - mHC-lite: the coefficient projection, H_pre, H_res and H_post per sublayer.
    - DenseFormer: the weighted sums after each block, d·L_b(L_b+3).
    """
    return residual_of(cfg).mixing_flops(cfg)


def _mlp_flops_per_block(cfg: _Derived) -> Any:
    mats = 3 if cfg.mlp == "swiglu" else 2
    return 2 * mats * cfg.d_model * cfg.ffn_dim


def forward_flops_per_token(
    cfg: _Derived, attended: Any = None, causal: bool = False
) -> FlopsBreakdown:
    """Forward FLOPs for one token of a training sequence of `cfg.seq_len` tokens.

    `attended` overrides the attended length; by default it is seq_len (dense s×s product,
    the standard count 24·h² + 4·s·h per layer of Narayanan et al. 2021 per token) or, with
    `causal`, the causal average (seq_len + 1)/2 (Kaplan et al.'s 2·n_layer·n_ctx·d_attn)."""
    if attended is None:
        attended = (cfg.seq_len + 1) / 2 if causal else cfg.seq_len
    proj_weights = 2 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * cfg.kv_dim
    return FlopsBreakdown(
        attention_proj_flops=2 * cfg.n_layers * proj_weights,
        attention_core_flops=attention_core_flops_per_token(cfg, attended),
        mlp_flops=cfg.n_layers * _mlp_flops_per_block(cfg),
        lm_head_flops=2 * cfg.d_model * cfg.vocab_size,
        depth_mixing_flops=depth_mixing_flops_per_token(cfg),
    )


def recompute_flops_per_token(
    cfg: _Derived, recompute: str = "none", attended: Any = None, causal: bool = False
) -> Any:
    """Forward FLOPs per token that activation recomputation runs again in the backward pass.

    - "full": every block's forward (its matrices, attention core and residual wiring), the
      LM head's excluded (Megatron-LM checkpoints the blocks only). Narayanan et al. 2021,
      *Efficient Large-Scale Language Model Training on GPU Clusters* (arXiv 2104.04473),
      count 4 passes of 24·B·s·h² + 4·B·s²·h per layer and 3 of
      the logits' 2·B·s·h·V: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) per step.
    - "selective": the attention core Q·Kᵀ and A·V, whose s×s products it does not keep
      (Korthikanti et al. 2022, arXiv 2205.05198, §5): 4·L_b·attended·d.
    - "none": 0.
    A fused attention kernel also recomputes Q·Kᵀ in its own backward whatever the mode; that
    is not counted here."""
    if recompute not in RECOMPUTE_MODES:
        raise CostInputError(
            "recompute",
            f"unknown value {recompute!r}; expected one of {', '.join(RECOMPUTE_MODES)}",
        )
    fwd = forward_flops_per_token(cfg, attended, causal)
    if recompute == "full":
        return fwd.total_flops - fwd.lm_head_flops
    if recompute == "selective":
        return fwd.attention_core_flops
    return 0 * fwd.total_flops


def training_flops_per_token(
    cfg: _Derived, attended: Any = None, causal: bool = False, recompute: str = "none"
) -> Any:
    """Forward + backward FLOPs per trained token: (1 + 2) × forward, plus the forward work
    `recompute` repeats (`recompute_flops_per_token`).

    With recompute="none" (the default) these are *model FLOPs*, what the model needs whatever
    the implementation: the figure a FLOPs budget counts (`budget.tokens_for_budget`).
    With a recomputation mode they are *hardware FLOPs*, what the device runs: full
    recomputation makes the blocks' share 4/3 of the model count (Narayanan et al. 2021,
    96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) per step against 72·B·s·L·h²·(1 + s/(6h) +
    V/(12·L·h)))."""
    model = (1 + BACKWARD_FACTOR) * forward_flops_per_token(cfg, attended, causal).total_flops
    if recompute == "none":
        return model
    return model + recompute_flops_per_token(cfg, recompute, attended, causal)


def stage_training_flops_per_token(
    cfg: _Derived, tensor: int, pipeline: int, recompute: str = "none", attended: Any = None
) -> list[Any]:
    """Hardware FLOPs per trained token on one device of each pipeline stage, stage 0 first.

    Every stage runs L_b/P blocks (with their residual wiring, 1/P of it): 3× their forward
    plus what `recompute` repeats; the last stage also runs the LM head, 3 × 2·d·V; all of it
    split over the t tensor ranks (the vocabulary-parallel head included)."""
    fwd = forward_flops_per_token(cfg, attended)
    head = (1 + BACKWARD_FACTOR) * fwd.lm_head_flops
    body = training_flops_per_token(cfg, attended, recompute=recompute) - head
    stages = [body / (pipeline * tensor)] * pipeline  # one shared (never mutated) value
    stages[-1] = stages[-1] + head / tensor
    return stages


def train_step_flops(cfg: _Derived, tokens: Any, causal: bool = False) -> Any:
    """Model FLOPs of training on `tokens` tokens (sequences of cfg.seq_len)."""
    return tokens * training_flops_per_token(cfg, causal=causal)


def prefill_flops(cfg: _Derived, tokens: Any) -> Any:
    """Forward FLOPs of a causal prefill of `tokens` tokens, logits for the last one only.

    Token t (1-based) attends to t positions, so the attention term sums to
    4·L_b·d·Σt = 2·L_b·d·T(T+1); the rest is per token. More tokens than a learned position
    table holds are refused (`check_positions`)."""
    check_positions(cfg, "prefill_tokens", tokens)
    fwd = forward_flops_per_token(cfg, attended=0)
    per_token = fwd.total_flops - fwd.lm_head_flops
    core = 2 * cfg.n_layers * cfg.d_model * tokens * (tokens + 1)
    return tokens * per_token + core + fwd.lm_head_flops


def decode_flops_per_token(cfg: _Derived, context: Any) -> Any:
    """Forward FLOPs of decoding one token that attends to `context` cached positions
    (itself included), with a KV cache. A context longer than a learned position table is
    refused (`check_positions`)."""
    check_positions(cfg, "decode_context", context)
    return forward_flops_per_token(cfg, attended=context).total_flops
