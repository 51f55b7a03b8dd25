"""Exact parameter counts, per component, for every residual variant.

The counts describe the model that `workers.model` builds from the same `ArchConfig`; the
conformance tests assert `param_count(cfg).total == sum(p.numel() for p in model.parameters())`.
All functions accept an `ArchConfig` (ints) or an `ArchGrid` (int64 arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cost_model._config import _Derived
from cost_model.residuals import residual_of


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts (number of scalars) per component."""

    embedding: Any  # token embedding V·d
    positions: Any  # learned positions T·d (0 with RoPE)
    attention: Any  # q, k, v, o projections (+ biases), all blocks
    mlp: Any  # up/gate/down projections (+ biases), all blocks
    norms: Any  # the two PreNorms per block and the final norm
    lm_head: Any  # V·d when the head is not tied to the embedding
    depth_mixing: Any  # per-sublayer residual wiring (pseudo-queries, key norms, mHC, DWA)
    depth_aggregation: Any  # the AttnRes output aggregation over all sources

    @property
    def total(self) -> Any:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def non_embedding(self) -> Any:
        """Kaplan et al. 2020's N: everything but the token and position embeddings."""
        return self.total - self.embedding - self.positions

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total"] = self.total
        return out


def norm_params(cfg: _Derived, width: Any) -> Any:
    """One RMSNorm (a gain of `width`) or LayerNorm (gain, plus a bias when `cfg.bias`)."""
    if cfg.norm == "layernorm" and cfg.bias:
        return 2 * width
    return width


def attention_params_per_block(cfg: _Derived) -> Any:
    """W_q (d×d), W_k and W_v (d×kv each), W_o (d×d); biases d + 2·kv + d when enabled.
    With n_kv_heads < n_heads this is grouped-query attention (Ainslie et al. 2023)."""
    d, kv = cfg.d_model, cfg.kv_dim
    weights = 2 * d * d + 2 * d * kv
    biases = (2 * d + 2 * kv) if cfg.bias else 0
    return weights + biases


def mlp_params_per_block(cfg: _Derived) -> Any:
    """GELU: d→f→d, 2·d·f (+ f + d biases). SwiGLU (Shazeer 2020): gate and up d→f, down
    f→d, 3·d·f (+ 2f + d biases)."""
    d, f = cfg.d_model, cfg.ffn_dim
    if cfg.mlp == "swiglu":
        return 3 * d * f + ((2 * f + d) if cfg.bias else 0)
    return 2 * d * f + ((f + d) if cfg.bias else 0)


def depth_mixing_params(cfg: _Derived) -> Any:
    """Parameters of the residual wiring inside the stack (the final aggregation excluded), as
    the variant counts them (`Residual.mixing_params`): none for the baseline; 2·d·L for Full
    and Block AttnRes (a pseudo-query and a key-norm gain per sublayer); mHC-lite's
    coefficient projections; DenseFormer's L_b·(L_b+3)/2 weights."""
    return residual_of(cfg).mixing_params(cfg)


def depth_aggregation_params(cfg: _Derived) -> Any:
    """AttnRes output aggregation: one more zero-initialised pseudo-query (with its key RMSNorm
    gain unless the variant drops key norms) over all sources before the final norm; 0 for
    variants without one (`Residual.aggregation_params`)."""
    return residual_of(cfg).aggregation_params(cfg)


def param_count(cfg: _Derived) -> ParamCount:
    """Exact parameter count. GPT-2 small (V = 50257, T = 1024, 12×768, LayerNorm with biases,
    learned positions, tied head) gives 124,439,808, as the Hugging Face checkpoint does."""
    d = cfg.d_model
    per_block_norms = 2 * norm_params(cfg, d)
    return ParamCount(
        embedding=cfg.vocab_size * d,
        positions=cfg.seq_len * d if cfg.positions == "learned" else 0 * d,
        attention=cfg.n_layers * attention_params_per_block(cfg),
        mlp=cfg.n_layers * mlp_params_per_block(cfg),
        norms=cfg.n_layers * per_block_norms + norm_params(cfg, d),
        lm_head=0 * d if cfg.tie_embeddings else cfg.vocab_size * d,
        depth_mixing=depth_mixing_params(cfg),
        depth_aggregation=depth_aggregation_params(cfg),
    )
