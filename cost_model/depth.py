"""Depth-source bookkeeping shared by the FLOP, memory, I/O and communication formulas.

A *source* is a d-vector per token that a sublayer's input may be built from. Each variant
states its own closed forms (no loops over sublayers, so that they hold for `ArchGrid` arrays
too) in `cost_model.residuals`; these functions ask it. Sources of the l-th sublayer (1-based,
Attention Residuals §3):
- Full AttnRes: v_0 (embedding) … v_{l−1}: l sources.
- Block AttnRes, sublayer i (1-based) of block n (0-based): b_0 … b_n (the embedding and the n
  finished blocks) plus the partial b_n^{i−1} when i ≥ 2 (a zero partial is never a source).
"""

from __future__ import annotations

from typing import Any

from cost_model._config import _Derived
from cost_model.residuals import residual_of


def attended_sources_total(cfg: _Derived) -> Any:
    """Σ over sublayers of the number of sources each sublayer attends to (AttnRes only; 0
    otherwise). Full: L(L+1)/2, O(L²); Block: L + Σ_j floor(j/S) + (L − N), O(L·N)."""
    return residual_of(cfg).attended_sources_total(cfg)


def aggregation_sources(cfg: _Derived) -> Any:
    """Sources of the AttnRes output aggregation: L + 1 (Full) or N + 1 (Block); 0 otherwise."""
    return residual_of(cfg).aggregation_sources(cfg)


def live_sources(cfg: _Derived) -> Any:
    """d-vectors per token that the forward pass must keep alive across depth (its working set):
    baseline 1, Full L + 1, Block N + 1, mHC-lite n, DenseFormer L_b + 1."""
    return residual_of(cfg).live_sources(cfg)


def cached_sources(cfg: _Derived) -> Any:
    """Depth representations a prefill must hold for every token, in the paper's convention
    (Attention Residuals §4: N·T·d for Block AttnRes; the embedding b_0 is recomputed from the
    token ids by a lookup, so it is not counted). Full L, Block N, DenseFormer L_b, mHC n,
    baseline 1 (its residual stream)."""
    return residual_of(cfg).cached_sources(cfg)


def sources_per_stage(cfg: _Derived, stages: int) -> Any:
    """N_p: depth representations produced per pipeline chunk when the L_b blocks are split
    evenly over `stages` chunks (a float when they do not divide)."""
    return residual_of(cfg).sources_per_stage(cfg, stages)
