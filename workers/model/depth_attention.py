"""Attention over depth: h = Σ_i α_i · v_i with α = softmax_i(qᵀk_i) (or a sigmoid, or given
static weights), per token.

`depth_attend` is a custom autograd function so that the backward pass keeps only the sources
themselves (shared by every sublayer that attends to them) and the weights — O(L·d) saved
memory for Full AttnRes instead of the O(L²·d) a stack per sublayer would save. The sources are
stacked only transiently, inside forward and backward.

FLOP counting (what `torch.utils.flop_counter` sees): the forward is two contractions, logits
(2·k·d per token) and the weighted sum (2·k·d); the backward counts the weight-gradient and
query-gradient contractions (2·k·d each); the per-source value and key gradients are broadcast
products, which a FLOP counter does not count.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.model.layers import upcast


def _logits(query: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """K (B, T, k, d), query (d,) or (B, T, d) → logits (B, T, k) in fp32.

    Written as matrix products (mm / bmm) so that a FLOP counter sees every contraction."""
    if query.dim() == 1:
        return (upcast(K) @ upcast(query)[:, None]).squeeze(-1)
    return (upcast(K) @ upcast(query)[..., None]).squeeze(-1)


def _weights(logits: torch.Tensor, gate: str) -> torch.Tensor:
    if gate == "softmax":
        return logits.softmax(dim=-1)
    if gate == "sigmoid":
        return logits.sigmoid()
    raise ValueError(f"gate: unknown value {gate!r}")


class _DepthAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, query: torch.Tensor, gate: str, shared: bool, *tensors: torch.Tensor
    ) -> torch.Tensor:
        n = len(tensors) if shared else len(tensors) // 2
        keys, values = tensors[:n], tensors[n:]
        K = torch.stack(keys, dim=2)  # (B, T, k, d), transient
        V = K if shared else torch.stack(values, dim=2)
        weights = _weights(_logits(query, K), gate)  # (B, T, k) fp32
        out = (weights.to(V.dtype)[..., None, :] @ V).squeeze(-2)  # (B, T, d)
        ctx.gate, ctx.n, ctx.shared = gate, n, shared
        ctx.save_for_backward(query, weights, *keys, *(() if shared else values))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        query, weights, *rest = ctx.saved_tensors
        n = ctx.n
        keys = rest[:n]
        values = keys if ctx.shared else rest[n:]
        K = torch.stack(keys, dim=2)  # (B, T, k, d)
        V = K if ctx.shared else torch.stack(values, dim=2)
        g = grad.to(V.dtype)
        d_weights = upcast((V @ g[..., None]).squeeze(-1))  # (B, T, k)
        if ctx.gate == "softmax":
            d_logits = weights * (d_weights - (weights * d_weights).sum(-1, keepdim=True))
        else:
            d_logits = d_weights * weights * (1 - weights)
        Kf = upcast(K)
        if query.dim() == 1:
            d = Kf.shape[-1]
            d_query = (d_logits.reshape(1, -1) @ Kf.reshape(-1, d)).reshape(d).to(query.dtype)
            q_b = upcast(query)
        else:
            d_query = (d_logits[..., None, :] @ Kf).squeeze(-2).to(query.dtype)  # (B, T, d)
            q_b = upcast(query)[..., None, :]
        d_keys = (d_logits[..., None] * q_b).to(K.dtype)  # (B, T, k, d)
        d_values = weights.to(g.dtype)[..., None] * g[..., None, :]  # (B, T, k, d)
        if ctx.shared:
            return (d_query, None, None, *(d_keys + d_values).unbind(2))
        return (d_query, None, None, *d_keys.unbind(2), *d_values.unbind(2))


def depth_attend(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor] | None = None,
    gate: str = "softmax",
) -> torch.Tensor:
    """Σ_i α_i·v_i with α = gate(query·k_i) over the sources (softmax over depth).

    query: (d,) (a pseudo-query) or (B, T, d) (input-dependent); keys, values: lists of
    (B, T, d). `values=None` means keys are the values (no key norm)."""
    values = keys if values is None else values
    if len(keys) != len(values) or not keys:
        raise ValueError("depth_attend needs as many keys as values, at least one")
    if values is keys:
        return _DepthAttention.apply(query, gate, True, *keys)
    return _DepthAttention.apply(query, gate, False, *keys, *values)


class _WeightedSum(torch.autograd.Function):
    """Σ_i w_i·v_i with static weights w (DenseFormer), saving only w and the sources."""

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        V = torch.stack(values, dim=-1)  # (B, T, d, k), transient
        ctx.save_for_backward(weights, *values)
        return (V @ weights.to(V.dtype)[:, None]).squeeze(-1)  # (B, T, d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        weights, *values = ctx.saved_tensors
        k = len(values)
        V = torch.stack(values, dim=-1)  # (B, T, d, k)
        g = grad.to(V.dtype)
        d_weights = (g.reshape(1, -1) @ V.reshape(-1, k)).reshape(k).to(weights.dtype)
        return (d_weights, *(w * g for w in weights.to(g.dtype).unbind(0)))


def weighted_sum(weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """Σ_i weights[i]·values[i] (static learned weights, no normalisation)."""
    return _WeightedSum.apply(weights, *values)
