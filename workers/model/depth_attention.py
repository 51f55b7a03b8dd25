"""Attention over depth: h = Σ_i α_i · v_i with α = softmax_i(qᵀk_i) (or a sigmoid), per token.

The key of a source is its parameter-free RMS normalisation k_i = r_i·v_i, r_i = 1/rms(v_i) (a
learned key gain is folded into the query by the caller). Because r_i is a per-token scalar,
qᵀk_i = r_i·(qᵀv_i): the normalised copy is never materialised, only r_i is kept (`rms_scale`).

Full and Block AttnRes with static pseudo-queries run on `depth_stack.DepthStack`, which
computes every logit of a source when the source is made; `depth_attend` serves the
input-dependent query of the `attnres_input_query` ablation, whose logits exist only per use.

`depth_attend` is a custom autograd function so that the backward pass keeps only the sources
themselves (shared by every sublayer that attends to them), their scales and the weights —
O(L·d) saved memory for Full AttnRes instead of the O(L²·d) a stack per sublayer would save. It
works source by source and never stacks the sources: one (B·T, d) × (d, 1) product per source
for the logits, a fused multiply-add per source for the weighted sum (stacking k sources into
one tensor costs more than the arithmetic on a CPU).

FLOP counting (what `torch.utils.flop_counter` sees): with a pseudo-query (d,), the logits
(2·k·d per token) in the forward and the query gradient (2·k·d) in the backward are matrix
products; so are the per-token dot products vᵢᵀg of the weight gradients (batched 1×d by d×1
products, 2·k·d); the weighted sum and the per-source value gradients are element-wise
multiply-adds, which a FLOP counter does not count. With an input-dependent query (B, T, d)
the logits and the query gradient are element-wise too.

Row invariance. Inference (without gradients) gives a sequence the same bits at any row of a
batch, as the training forward does (on one CPU thread: several threads split small products
by position, which no model code controls). Two kinds of CPU kernel break it, and the
inference paths avoid both: a matrix-vector product (one query against the rows, or one
query's row of a product with the rows on the columns) takes a different code path by a row's
offset, and so does a matrix product with the rows as its rows and a few queries as its
columns (on AVX-512 its kernel treats the rows of a tail block apart), where a per-row dot
product (`vecdot`) does not; and `softplus` and `sigmoid` compute a vector's tail in scalar
code that rounds differently, where `logsigmoid` and `exp` do not (softplus(t) =
−logsigmoid(−t), σ(t) = exp(logsigmoid(t))). Measured on a CPU with `torch` 2.x: without
these, a sequence's fp32 logits moved by up to ~1e−6 with its row in the batch.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from workers.model import layers
from workers.model.layers import upcast


def rms_scale(v: torch.Tensor) -> torch.Tensor:
    """The key scale r = 1/rms(v) of a source (B, T, d) → (B, T), fp32 (or fp64), outside
    autograd: `depth_attend` differentiates the normalisation itself."""
    with torch.no_grad():
        dtype = torch.float32 if v.dtype in (torch.float16, torch.bfloat16) else v.dtype
        norm = torch.linalg.vector_norm(v, dim=-1, dtype=dtype)
        scale: torch.Tensor = norm.square_().div_(v.shape[-1]).add_(layers.NORM_EPS).rsqrt_()
        return scale


def _logit(query: torch.Tensor, value: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """qᵀk per token with k = scale·v, fp32 (or fp64): value (B, T, d), query (d,) or
    (B, T, d) → (B, T)."""
    v = upcast(value)
    if query.dim() == 1:
        logit = (v.reshape(-1, v.shape[-1]) @ upcast(query)[:, None]).view(v.shape[:-1])
    else:
        logit = torch.linalg.vecdot(v, upcast(query))
    return logit if scale is None else logit.mul_(scale)


def _row_logit(
    query: torch.Tensor, value: torch.Tensor, scale: torch.Tensor | None
) -> torch.Tensor:
    """`_logit` for inference, row-invariant (the module's docstring): a pseudo-query's
    products as per-row dot products, not a matrix-vector product."""
    logit: torch.Tensor = torch.linalg.vecdot(upcast(value), upcast(query))
    return logit if scale is None else logit.mul_(scale)


def _sigmoid(t: torch.Tensor) -> torch.Tensor:
    """σ(t) = exp(logsigmoid(t)), row-invariant (the module's docstring), where `sigmoid`
    is not: inference only."""
    return F.logsigmoid(t).exp_()


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token aᵀb of two (B, T, d) tensors → (B, T), as a batched product."""
    d = a.shape[-1]
    return torch.bmm(a.reshape(-1, 1, d), b.reshape(-1, d, 1)).view(a.shape[:-1])


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
    """Inputs: query, gate, n, then n values and n key scales (no scales: the raw values are
    the keys). Gradients flow to the query and the values; the keys' normalisation is
    differentiated here, in closed form."""

    @staticmethod
    def forward(
        ctx: Any, query: torch.Tensor, gate: str, n: int, *tensors: torch.Tensor
    ) -> torch.Tensor:
        values, scales = tensors[:n], tensors[n:]
        logits = torch.stack(
            [_logit(query, v, scales[i] if scales else None) for i, v in enumerate(values)]
        )  # (k, B, T) fp32
        weights = _weights(logits, gate)
        ctx.gate, ctx.n = gate, n
        ctx.save_for_backward(query, weights, logits, *values, *scales)
        return _weighted_sum(weights, values)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        query, weights, logits, *rest = ctx.saved_tensors
        n = ctx.n
        values, scales = rest[:n], rest[n:]
        g = upcast(grad)
        d_weights = torch.stack([_dot(upcast(v), g) for v in values])  # (k, B, T)
        if ctx.gate == "softmax":
            d_logits = weights * (d_weights - (weights * d_weights).sum(0, keepdim=True))
        else:
            d_logits = d_weights * weights * (1 - weights)
        q = upcast(query)
        static = query.dim() == 1
        d_query = None
        d_values = []
        for i in range(n):
            v = upcast(values[i])
            d = v.shape[-1]
            # logit s_i = r_i·(qᵀv_i): dq += dl_i·r_i·v_i; and with r_i = (mean(v_i²) + ε)^(-1/2),
            # dv_i = α_i·g + r_i·dl_i·q − (r_i·dl_i)·(s_i·r_i/d)·v_i
            dl = d_logits[i] if not scales else d_logits[i] * upcast(scales[i])  # (B, T)
            if static:
                term = (dl.reshape(1, -1) @ v.reshape(-1, d)).reshape(-1)  # (d,)
            else:
                term = dl[..., None] * v
            d_query = term if d_query is None else d_query + term
            dv = g * weights[i, ..., None]
            dv.addcmul_(q, dl[..., None])
            if scales:
                dv.addcmul_(v, dl[..., None] * (logits[i] * upcast(scales[i]) / -d)[..., None])
            d_values.append(dv.to(values[i].dtype))
        assert d_query is not None
        return (d_query.to(query.dtype), None, None, *d_values, *([None] * len(scales)))


def depth_attend(
    query: torch.Tensor,
    values: list[torch.Tensor],
    scales: list[torch.Tensor] | None = None,
    gate: str = "softmax",
) -> torch.Tensor:
    """Σ_i α_i·v_i with α = gate(qᵀk_i) over the sources (softmax over depth).

    query: (d,) (a pseudo-query) or (B, T, d) (input-dependent); values: list of (B, T, d);
    scales: per value its `rms_scale` (the key is the RMS-normalised value), or None when the
    raw values are the keys (no key norm)."""
    if not values or (scales is not None and len(scales) != len(values)):
        raise ValueError("depth_attend needs one key scale per value, at least one")
    n = len(values)
    if not torch.is_grad_enabled():  # inference: the same arithmetic without autograd
        if values[0].numel() * n <= STACK_LIMIT:
            return _attend_stacked(query, values, scales, gate)
        logits = torch.stack(
            [_row_logit(query, v, scales[i] if scales else None) for i, v in enumerate(values)]
        )
        return _weighted_sum(_weights(logits, gate), tuple(values))
    out: torch.Tensor = _DepthAttention.apply(query, gate, n, *values, *(scales or ()))  # type: ignore[no-untyped-call]
    return out


#: Below this many source elements (a decoding step: a few tokens) the inference path stacks
#: the sources and runs a handful of batched operations instead of a few per source: there
#: the cost is the number of operations, not the bytes. Above it, stacking copies every
#: source once more than the arithmetic reads it, so the per-source path is faster.
STACK_LIMIT = 1 << 16


def _attend_stacked(
    query: torch.Tensor, values: list[torch.Tensor], scales: list[torch.Tensor] | None, gate: str
) -> torch.Tensor:
    V = upcast(torch.stack(values, dim=-2))  # (B, T, k, d)
    q = upcast(query)
    logits = torch.linalg.vecdot(V, q if q.dim() == 1 else q[..., None, :])  # (B, T, k)
    if scales:
        logits = logits * torch.stack(scales, dim=-1)
    weights = logits.softmax(dim=-1) if gate == "softmax" else _weights(logits, gate)
    return (weights[..., None, :] @ V).squeeze(-2).to(values[0].dtype)


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
    out: torch.Tensor = _WeightedSum.apply(weights, *values)  # type: ignore[no-untyped-call]
    return out


def _phase1(
    queries: torch.Tensor,
    values: tuple[torch.Tensor, ...],
    scales: tuple[torch.Tensor, ...],
    row_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The Phase-1 arithmetic over the k finished sources stacked once, V (B·T, k, d): logits
    and weights (B·T, k, S), and per query h¹ (B, T, d) and lse¹ (B, T). One output per query
    (no stacked output: selecting from one would zero-fill it whole for every query's
    gradient)."""
    n = len(values)
    B, T, d = values[0].shape
    S = queries.shape[0]
    V = upcast(torch.stack(values, dim=2).reshape(B * T, n, d))
    R = torch.stack(scales, dim=-1).reshape(B * T, n, 1)
    if row_invariant:  # per-row dot products, not a matrix product (the module's docstring)
        logits = torch.linalg.vecdot(V[:, :, None], upcast(queries)).mul_(R)  # (BT, k, S)
    else:
        logits = torch.matmul(V, upcast(queries).T).mul_(R)  # (BT, k, S)
    lse = torch.logsumexp(logits, dim=1, keepdim=True)  # (BT, 1, S)
    weights = torch.exp(logits - lse)
    h1 = torch.bmm(weights.transpose(1, 2), V).view(B, T, S, d)
    lse = lse.view(B, T, S)
    return V, logits, weights, [h1[:, :, i] for i in range(S)], [lse[..., i] for i in range(S)]


class _BlockPhase1(torch.autograd.Function):
    """Phase 1 of Block AttnRes, differentiable: the S pseudo-queries of a block attend to its
    k finished sources in one batched pass. Returns, per query, the normalised partial result
    h¹ (S, B, T, d) and its log-sum-exp (S, B, T); saves the shared sources, their key scales,
    the logits and the weights."""

    @staticmethod
    def forward(ctx: Any, queries: torch.Tensor, n: int, *tensors: torch.Tensor) -> Any:
        values, scales = tensors[:n], tensors[n:]
        _, logits, weights, h1, lse = _phase1(queries, values, scales)
        B, T, d = values[0].shape
        ctx.n, ctx.shape = n, (B, T, d)
        ctx.save_for_backward(queries, logits, weights, *values, *scales)
        return (*h1, *lse)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        queries, logits, weights, *rest = ctx.saved_tensors
        n, (B, T, d) = ctx.n, ctx.shape
        values, scales = rest[:n], rest[n:]
        S = queries.shape[0]
        ref = upcast(values[0])
        g = torch.zeros(B, T, S, d, dtype=ref.dtype, device=ref.device)
        dl = torch.zeros(B, T, S, dtype=weights.dtype, device=ref.device)
        for i in range(S):
            g_h, g_lse = grads[i], grads[S + i]
            if g_h is not None:
                g[:, :, i] = g_h
            if g_lse is not None:
                dl[..., i] = g_lse
        g = g.view(B * T, S, d)
        dl = dl.view(B * T, 1, S)
        V = upcast(torch.stack(values, dim=2).reshape(B * T, n, d))
        d_w = torch.bmm(V, g.transpose(1, 2))  # (BT, k, S)
        d_v = torch.bmm(weights.to(g.dtype), g)  # (BT, k, d)
        d_logits = weights * (d_w - (weights * d_w).sum(1, keepdim=True) + dl)  # (BT, k, S)
        q = upcast(queries)
        d_q = torch.zeros_like(q)
        out = []
        for j in range(n):
            v = V[:, j]
            r = upcast(scales[j]).reshape(-1, 1)
            # logit s_js = r_j·(q_sᵀv_j), r_j = (mean(v_j²) + ε)^(-1/2):
            # dq_s += Σ dl_js·r_j·v_j;  dv_j = r_j·Σ_s dl_js·q_s − (r_j²/d)·(Σ_s dl_js·s_js)·v_j
            dl_j = d_logits[:, j]  # (BT, S)
            dl_r = dl_j * r
            d_q += dl_r.T @ v  # (S, d)
            d_v_j = torch.addmm(d_v[:, j], dl_r, q)
            coef = (dl_j * logits[:, j]).sum(-1, keepdim=True).mul_(r.square()).div_(-d)
            d_v_j.addcmul_(v, coef)
            out.append(d_v_j.reshape(B, T, d).to(values[j].dtype))
        return (d_q.to(queries.dtype), None, *out, *([None] * n))


def block_phase1(
    queries: torch.Tensor, values: list[torch.Tensor], scales: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per query of S (S, d) over the finished sources with their `rms_scale`s: the lists of
    h¹ (B, T, d) and of lse¹ (B, T)."""
    if not torch.is_grad_enabled():
        *_, h1, lse = _phase1(queries, tuple(values), tuple(scales), row_invariant=True)
        return h1, lse
    out = _BlockPhase1.apply(queries, len(values), *values, *scales)  # type: ignore[no-untyped-call]
    S = queries.shape[0]
    return list(out[:S]), list(out[S:])


def _merge_inference(
    h1: torch.Tensor, lse1: torch.Tensor, p: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    pf = upcast(p)
    d = pf.shape[-1]
    s = torch.linalg.vecdot(F.rms_norm(pf, (d,), eps=layers.NORM_EPS), upcast(q))  # (B, T)
    beta = _sigmoid(s - upcast(lse1))
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
    out: torch.Tensor = _Merge.apply(h1, lse1, partial, query)  # type: ignore[no-untyped-call]
    return out


#: The online schedule keeps one (B·T, d) state per use: it serves inputs up to this many state
#: elements (a decoding step); larger ones (a long prefill) take Phase 1 per block, whose memory
#: is the N + 1 block sources and one block's S results, as Block AttnRes promises.
ONLINE_LIMIT = 1 << 21


class ScaledQueries:
    """What `OnlineDepth` takes, made from the static queries (U, d) once per pass: every
    use's query times √d (`Qs`) and negated (`neg`), and √(d·ε) as a 0-d tensor (`c`)."""

    def __init__(self, queries: torch.Tensor) -> None:
        d = queries.shape[-1]
        self.Qs = upcast(queries.detach()).mul(math.sqrt(d))
        self.neg = self.Qs.neg()
        c = math.sqrt(d * layers.NORM_EPS)
        self.c = torch.full((), c, dtype=self.Qs.dtype, device=self.Qs.device)


class OnlineDepth:
    """Inference over depth with static queries, every use's Phase 1 kept online: Block
    AttnRes's two-phase schedule with the fewest operations per token (decoding is bound by
    their number, not by arithmetic).

    Per use u the state is o_u, the softmax-weighted mean of the sources pushed so far, and
    −lse_u, their negated log-sum-exp. `push(v, f)` merges a finished source into every use
    from f on at once: with t = s − lse, o ← o + σ(t)·(v − o) and −lse ← −lse − softplus(t),
    exact (the joint softmax, written without exponentials that could overflow). `input(u)` is
    o_u; `merged(u, p)` also takes in a source that only use u reads (the running partial; the
    last block, for the aggregation) without changing the state. Keys are RMS-normalised:
    s = qᵀv/√(|v|²/d + ε) = (√d·q)ᵀv / hypot(|v|, √(d·ε)). Until the first push every o_u is
    the first source itself, so the state is made by that push, for the uses after it.
    Memory: U·B·T·d, hence `ONLINE_LIMIT`."""

    def __init__(self, queries: ScaledQueries, first: torch.Tensor) -> None:
        self.q = queries
        self.dtype = first.dtype
        self.off = _autocast_off(first)
        with self.off:
            self.first = self._cast(first)
            self.nlse = self._logits(queries.neg, self.first, None)  # (U, B, T)
            self.nlse_cols = self.nlse.unsqueeze(-1).unbind(0)  # (B, T, 1) each, views
            self.o: torch.Tensor | None = None  # made by the first push
            self.o_from = 0  # the use of o[0]
            self.inputs: tuple[torch.Tensor, ...] = (self.first,) * queries.Qs.shape[0]

    @staticmethod
    def fits(uses: int, first: torch.Tensor) -> bool:
        return uses * first.numel() <= ONLINE_LIMIT

    def _cast(self, v: torch.Tensor) -> torch.Tensor:
        # (a conversion to the same dtype is still an operation: skipped)
        dtype = self.q.Qs.dtype
        return v if v.dtype == dtype else v.to(dtype)

    def _logits(
        self, Qs: torch.Tensor, v: torch.Tensor, shift: torch.Tensor | None
    ) -> torch.Tensor:
        """(k, B, T): the logits of v (B, T, d) for k scaled queries, plus `shift`."""
        B, T, d = v.shape
        v = v.reshape(B * T, d)
        hyp = torch.hypot(torch.linalg.vector_norm(v, dim=-1), self.q.c).view(B, T)
        s = torch.linalg.vecdot(v, Qs[:, None, :]).view(-1, B, T)  # row-invariant (module docs)
        return s.div_(hyp) if shift is None else torch.addcdiv(shift, s, hyp)

    def input(self, use: int) -> torch.Tensor:
        h = self.inputs[use]
        return h if h.dtype == self.dtype else h.to(self.dtype)

    def merged(self, use: int, p: torch.Tensor) -> torch.Tensor:
        q = self.q
        with self.off:
            v = self._cast(p)
            hyp = torch.hypot(torch.linalg.vector_norm(v, dim=-1, keepdim=True), q.c)
            s = torch.linalg.vecdot(v, q.Qs[use]).unsqueeze(-1)  # row-invariant (module docs)
            t = torch.addcdiv(self.nlse_cols[use], s, hyp)
            h = torch.lerp(self.inputs[use], v, _sigmoid(t))
        return h if h.dtype == self.dtype else h.to(self.dtype)

    def push(self, value: torch.Tensor, first_use: int) -> None:
        f = first_use
        with self.off:
            v = self._cast(value)
            nlse = self.nlse[f:]
            t = self._logits(self.q.Qs[f:], v, nlse)  # s − lse, (U − f, B, T)
            nlse += F.logsigmoid(t.neg())  # −softplus(t), exact for any t; row-invariant
            beta = _sigmoid(t).unsqueeze(-1)
            if self.o is None:  # every later use's state so far is the first source
                self.o, self.o_from = torch.lerp(self.first, v, beta), f
                self.inputs = self.inputs[:f] + self.o.unbind(0)
            else:
                self.o[f - self.o_from :].lerp_(v, beta)


def _autocast_off(x: torch.Tensor) -> Any:
    """Depth arithmetic stays in the sources' precision: autocast off (when it is on)."""
    kind = x.device.type
    return torch.autocast(kind, enabled=False) if torch.is_autocast_enabled(kind) else nullcontext()
