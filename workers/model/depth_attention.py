"""Attention over depth: h = Σ_i α_i · v_i with α = softmax_i(qᵀk_i) (or a sigmoid), per token.

`depth_attend` is a custom autograd function so that the backward pass keeps only the sources
themselves (shared by every sublayer that attends to them) and the weights — O(L·d) saved
memory for Full AttnRes instead of the O(L²·d) a stack per sublayer would save. It works
source by source and never stacks the sources: one (B·T, d) × (d, 1) product per source for
the logits, a fused multiply-add per source for the weighted sum (stacking k sources into one
tensor costs more than the arithmetic on a CPU).

FLOP counting (what `torch.utils.flop_counter` sees): with a pseudo-query (d,), the logits
(2·k·d per token) in the forward and the query gradient (2·k·d) in the backward are matrix
products; the weighted sum, the weight gradients and the per-source key and value gradients
are element-wise multiply-adds, which a FLOP counter does not count. With an input-dependent
query (B, T, d) every term is element-wise.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from workers.model import layers
from workers.model.layers import upcast


def _logit(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """qᵀk per token, fp32 (or fp64): key (B, T, d), query (d,) or (B, T, d) → (B, T)."""
    k = upcast(key)
    if query.dim() == 1:
        return (k.reshape(-1, k.shape[-1]) @ upcast(query)[:, None]).view(k.shape[:-1])
    return (k * upcast(query)).sum(-1)


def _weights(logits: torch.Tensor, gate: str) -> torch.Tensor:
    if gate == "softmax":
        return logits.softmax(dim=0)
    if gate == "sigmoid":
        return logits.sigmoid()
    raise ValueError(f"gate: unknown value {gate!r}")


def _weighted_sum(weights: torch.Tensor, values: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Σ_i weights[i] (B, T) · values[i] (B, T, d), one fused multiply-add per source."""
    w = weights.to(values[0].dtype)
    out = values[0] * w[0, ..., None]
    for i in range(1, len(values)):
        out.addcmul_(values[i], w[i, ..., None])
    return out


class _DepthAttention(torch.autograd.Function):
    """Inputs: query, gate, n, then n values, n keys and n key scales (1/rms, or None-free
    when the keys are the raw values: `scales` empty). Gradients flow to the query and the
    values only; the keys' normalisation is differentiated here, in closed form."""

    @staticmethod
    def forward(
        ctx: Any, query: torch.Tensor, gate: str, n: int, *tensors: torch.Tensor
    ) -> torch.Tensor:
        values, keys, scales = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        keys = keys or values
        logits = torch.stack([_logit(query, k) for k in keys])  # (k, B, T) fp32
        weights = _weights(logits, gate)
        ctx.gate, ctx.n, ctx.normed = gate, n, bool(scales)
        normed = (*keys, *scales) if scales else ()
        ctx.save_for_backward(query, weights, logits, *values, *normed)
        return _weighted_sum(weights, values)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        query, weights, logits, *rest = ctx.saved_tensors
        n = ctx.n
        values = rest[:n]
        keys = rest[n : 2 * n] if ctx.normed else values
        scales = rest[2 * n :] if ctx.normed else None
        g = upcast(grad)
        d_weights = torch.stack([torch.linalg.vecdot(upcast(v), g) for v in values])  # (k, B, T)
        if ctx.gate == "softmax":
            d_logits = weights * (d_weights - (weights * d_weights).sum(0, keepdim=True))
        else:
            d_logits = d_weights * weights * (1 - weights)
        q = upcast(query)
        static = query.dim() == 1
        d_query = None
        d_values = []
        for i in range(n):
            dl = d_logits[i]  # (B, T)
            key = upcast(keys[i])
            if static:
                term = (dl.reshape(1, -1) @ key.reshape(-1, key.shape[-1])).reshape(-1)  # (d,)
            else:
                term = dl[..., None] * key
            d_query = term if d_query is None else d_query + term
            # value path: α_i·g; key path: k_i = v_i·r_i (parameter-free RMS norm), so
            # dL/dv_i = r_i·dl_i·(q − k_i·(qᵀk_i)/d), with qᵀk_i the logit.
            dv = g * weights[i, ..., None]
            if scales is None:
                dv.addcmul_(q, dl[..., None])
            else:
                coef = upcast(scales[i]) * dl[..., None]  # (B, T, 1)
                dv.addcmul_(q, coef)
                dv.addcmul_(key, -coef * (logits[i][..., None] / key.shape[-1]))
            d_values.append(dv.to(values[i].dtype))
        assert d_query is not None
        scale_grads = [None] * (2 * n) if scales is not None else []
        return (d_query.to(query.dtype), None, None, *d_values, *scale_grads)


def rms_key(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The parameter-free RMS-normalised key of a source and its scale 1/rms (B, T, 1), both
    outside autograd: `depth_attend` differentiates the normalisation itself."""
    with torch.no_grad():
        vf = upcast(v)
        scale = torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + layers.NORM_EPS)
        return (vf * scale).to(v.dtype), scale


def depth_attend(
    query: torch.Tensor,
    values: list[torch.Tensor],
    keys: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    gate: str = "softmax",
) -> torch.Tensor:
    """Σ_i α_i·v_i with α = gate(query·k_i) over the sources (softmax over depth).

    query: (d,) (a pseudo-query) or (B, T, d) (input-dependent); values: list of (B, T, d);
    keys: per value its `rms_key` (normalised key, scale), or None when the raw values are
    the keys (no key norm)."""
    if not values or (keys is not None and len(keys) != len(values)):
        raise ValueError("depth_attend needs one key per value, at least one")
    n = len(values)
    if not torch.is_grad_enabled():  # inference: the same arithmetic without autograd
        logits = torch.stack(
            [_logit(query, k) for k, _ in keys] if keys else [_logit(query, v) for v in values]
        )
        return _weighted_sum(_weights(logits, gate), tuple(values))
    if keys is None:
        return _DepthAttention.apply(query, gate, n, *values)
    return _DepthAttention.apply(
        query, gate, n, *values, *(k for k, _ in keys), *(s for _, s in keys)
    )


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


def _phase1(
    queries: torch.Tensor, values: tuple[torch.Tensor, ...], keys: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The Phase-1 arithmetic: weights (k, B·T, S), and per query h¹ (B, T, d), lse¹ (B, T).
    One output per query (no stacked output: selecting from one would zero-fill it whole
    for every query's gradient)."""
    n = len(values)
    B, T, d = values[0].shape
    S = queries.shape[0]
    q = upcast(queries)
    logits = torch.stack([upcast(k).reshape(-1, d) @ q.T for k in keys])  # (k, BT, S)
    lse = torch.logsumexp(logits, dim=0)  # (BT, S)
    weights = torch.exp(logits - lse)  # (k, BT, S)
    V = torch.stack(values, dim=2).reshape(B * T, n, d)  # (BT, k, d), transient
    h1 = torch.bmm(weights.permute(1, 2, 0).to(V.dtype), V).view(B, T, S, d)
    lse = lse.view(B, T, S)
    return weights, [h1[:, :, i] for i in range(S)], [lse[..., i] for i in range(S)]


class _BlockPhase1(torch.autograd.Function):
    """Phase 1 of Block AttnRes, differentiable: the S pseudo-queries of a block attend to its
    k finished sources in one batched pass. Returns, per query, the normalised partial result
    h¹ (S, B, T, d) and its log-sum-exp (S, B, T); saves the shared sources and the weights."""

    @staticmethod
    def forward(ctx: Any, queries: torch.Tensor, n: int, *tensors: torch.Tensor) -> Any:
        values, keys, scales = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        weights, h1, lse = _phase1(queries, values, keys)
        B, T, d = values[0].shape
        ctx.n, ctx.shape = n, (B, T, d)
        ctx.save_for_backward(queries, weights, *values, *keys, *scales)
        return (*h1, *lse)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        queries, weights, *rest = ctx.saved_tensors
        n, (B, T, d) = ctx.n, ctx.shape
        values, keys, scales = rest[:n], rest[n : 2 * n], rest[2 * n :]
        S = queries.shape[0]
        ref = upcast(values[0])
        g = torch.zeros(B, T, S, d, dtype=ref.dtype)
        dl = torch.zeros(B, T, S, dtype=weights.dtype)
        for i in range(S):
            if grads[i] is not None:
                g[:, :, i] = grads[i]
            if grads[S + i] is not None:
                dl[..., i] = grads[S + i]
        g = g.view(B * T, S, d)
        dl = dl.view(B * T, S)
        V = upcast(torch.stack(values, dim=2).reshape(B * T, n, d))
        d_w = torch.bmm(g, V.transpose(1, 2)).permute(2, 0, 1)  # (k, BT, S)
        d_v = torch.bmm(weights.permute(1, 0, 2).to(g.dtype), g)  # (BT, k, d)
        d_logits = weights * (d_w - (weights * d_w).sum(0, keepdim=True) + dl)  # (k, BT, S)
        q = upcast(queries)
        d_q = torch.zeros_like(q)
        grads = []
        for j in range(n):
            key = upcast(keys[j]).reshape(-1, d)
            d_q += d_logits[j].T @ key  # (S, d)
            d_key = d_logits[j] @ q  # (BT, d)
            # through the parameter-free RMS norm k = v·r: dv = r·(dk − k·mean(dk ⊙ k))
            r = upcast(scales[j]).reshape(-1, 1)
            d_key.sub_(key * (d_key * key).mean(-1, keepdim=True)).mul_(r)
            d_key.add_(d_v[:, j])
            grads.append(d_key.reshape(B, T, d).to(values[j].dtype))
        return (d_q.to(queries.dtype), None, *grads, *([None] * (2 * n)))


def block_phase1(
    queries: torch.Tensor, values: list[torch.Tensor], keys: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per query of S (S, d) over the finished sources with their `rms_key`s: the lists of
    h¹ (B, T, d) and of lse¹ (B, T)."""
    if not torch.is_grad_enabled():
        _, h1, lse = _phase1(queries, tuple(values), tuple(k for k, _ in keys))
        return h1, lse
    out = _BlockPhase1.apply(
        queries, len(values), *values, *(k for k, _ in keys), *(s for _, s in keys)
    )
    S = queries.shape[0]
    return list(out[:S]), list(out[S:])


def _merge_inference(
    h1: torch.Tensor, lse1: torch.Tensor, p: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    pf = upcast(p)
    d = pf.shape[-1]
    s = F.rms_norm(pf, (d,), eps=layers.NORM_EPS) @ upcast(q)  # (B, T)
    beta = torch.sigmoid(s - upcast(lse1))
    return torch.lerp(upcast(h1), pf, beta[..., None]).to(p.dtype)


class _Merge(torch.autograd.Function):
    """Phase 2 merge of one new source p (the running partial) into a Phase-1 result:
    s = qᵀ·RMSNorm(p), β = σ(s − lse¹), h = h¹ + β·(p − h¹) — the joint softmax over the
    finished sources and p, differentiable in closed form."""

    @staticmethod
    def forward(
        ctx: Any, h1: torch.Tensor, lse1: torch.Tensor, p: torch.Tensor, q: torch.Tensor
    ) -> torch.Tensor:
        pf = upcast(p)
        r = torch.rsqrt(pf.pow(2).mean(-1, keepdim=True) + layers.NORM_EPS)  # (B, T, 1)
        s = (pf * r) @ upcast(q)  # (B, T)
        beta = torch.sigmoid(s - upcast(lse1))
        h = torch.lerp(upcast(h1), pf, beta[..., None])
        ctx.save_for_backward(h1, p, q, r, s, beta)
        return h.to(p.dtype)

    @staticmethod
    def backward(ctx: Any, d_h: torch.Tensor) -> Any:
        h1, p, q, r, s, beta = ctx.saved_tensors
        g, pf, qf, b = upcast(d_h), upcast(p), upcast(q), beta[..., None]
        d_beta = ((pf - upcast(h1)) * g).sum(-1)
        d_s = d_beta * beta * (1 - beta)  # (B, T)
        d_h1 = g * (1 - b)
        d_lse = -d_s
        n = pf * r
        d_q = (d_s.reshape(1, -1) @ n.reshape(-1, n.shape[-1])).reshape(-1)
        # dp = β·g + r·ds·(q − n·s/d)
        d_p = g * b
        coef = r * d_s[..., None]
        d_p.addcmul_(qf, coef).addcmul_(n, -coef * (s[..., None] / n.shape[-1]))
        return d_h1.to(h1.dtype), d_lse, d_p.to(p.dtype), d_q.to(q.dtype)


def merge_partial(
    h1: torch.Tensor, lse1: torch.Tensor, partial: torch.Tensor, query: torch.Tensor
) -> torch.Tensor:
    """The input of a block's i-th sublayer (i ≥ 2) from its Phase-1 result and b_n^{i−1}."""
    if not torch.is_grad_enabled():
        return _merge_inference(h1, lse1, partial, query)
    return _Merge.apply(h1, lse1, partial, query)
