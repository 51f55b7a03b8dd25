"""Depth-source bookkeeping shared by the FLOP, memory, I/O and communication formulas.

A *source* is a d-vector per token that a sublayer's input may be built from. Closed forms (no
loops over sublayers) so that they hold for `ArchGrid` arrays too.

Sources of the l-th sublayer (1-based, Attention Residuals §3):
- Full AttnRes: v_0 (embedding) … v_{l−1}: l sources.
- Block AttnRes, sublayer i (1-based) of block n (0-based): b_0 … b_n (the embedding and the n
  finished blocks) plus the partial b_n^{i−1} when i ≥ 2 (a zero partial is never a source).
"""

from __future__ import annotations

from typing import Any

from cost_model._config import FULL_ATTNRES_FAMILY, _Derived


def _floor_sum(length: Any, size: Any) -> Any:
    """Σ_{j=0}^{length−1} floor(j / size) in closed form: the q = ceil(length/size) − 1
    complete blocks contribute size·q(q−1)/2, the last (possibly short) one q·r."""
    q = -(-length // size) - 1
    r = length - q * size
    return size * q * (q - 1) // 2 + q * r


def attended_sources_total(cfg: _Derived) -> Any:
    """Σ over sublayers of the number of sources each sublayer attends to (AttnRes only).

    Full: Σ_{l=1}^{L} l = L(L+1)/2, O(L²).
    Block: Σ_j (1 + n_j + [i_j ≥ 2]) = L + Σ_j floor(j/S) + (L − N), O(L·N).
    """
    sub = cfg.n_sublayers
    if cfg.variant in FULL_ATTNRES_FAMILY:
        return sub * (sub + 1) // 2
    if cfg.variant == "block_attnres":
        return sub + _floor_sum(sub, cfg.block_size) + (sub - cfg.n_blocks)
    return 0 * sub


def aggregation_sources(cfg: _Derived) -> Any:
    """Sources of the AttnRes output aggregation: L + 1 (Full) or N + 1 (Block)."""
    if cfg.variant in FULL_ATTNRES_FAMILY or cfg.variant == "block_attnres":
        return cfg.n_blocks + 1
    return 0 * cfg.n_layers


def live_sources(cfg: _Derived) -> Any:
    """d-vectors per token that the forward pass must keep alive across depth (its working set).

    baseline 1 (the residual stream); Full L + 1 (Attention Residuals: O(L·d)); Block N + 1
    (b_0 … b_{N−1} and the current partial, O(N·d)); mHC-lite n streams; DenseFormer L_b + 1
    (the embedding and every block output).
    """
    v = cfg.variant
    if v in FULL_ATTNRES_FAMILY or v == "block_attnres":
        return cfg.n_blocks + 1
    if v == "mhc_lite":
        return cfg.streams + 0 * cfg.n_layers
    if v == "denseformer":
        return cfg.n_layers + 1
    return 1 + 0 * cfg.n_layers


def cached_sources(cfg: _Derived) -> Any:
    """Depth representations a prefill must hold for every token, in the paper's convention
    (Attention Residuals §4: N·T·d for Block AttnRes; the embedding b_0 is recomputed from the
    token ids by a lookup, so it is not counted). Full L, Block N, DenseFormer L_b, mHC n,
    baseline 1 (its residual stream)."""
    v = cfg.variant
    if v in FULL_ATTNRES_FAMILY or v == "block_attnres":
        return cfg.n_blocks
    if v == "mhc_lite":
        return cfg.streams + 0 * cfg.n_layers
    if v == "denseformer":
        return cfg.n_layers
    return 1 + 0 * cfg.n_layers


def sources_per_stage(cfg: _Derived, stages: int) -> Any:
    """N_p: depth representations produced per pipeline chunk when the L_b blocks are split
    evenly over `stages` chunks (a float when they do not divide)."""
    v = cfg.variant
    if v in FULL_ATTNRES_FAMILY or v == "block_attnres":
        return cfg.n_blocks / stages
    if v == "denseformer":
        return cfg.n_layers / stages
    return 0 * cfg.n_layers
