"""Depth attention with static pseudo-queries over a growing stack of sources: the training and
sequential path of Full and Block AttnRes.

With static queries every logit a source will ever get is known when the source is made:
s_ji = r_i·(q_jᵀv_i) for every later use j (sublayers, then the output aggregation). So the
work is organised per source and per use instead of per (source, use) pair, over buffers the
uses share, token-major so that a token's sources are one contiguous (k, d) matrix:

- pushing source i writes it once into V (B·T, slots, d), keeps its key scale r_i = 1/rms(v_i)
  (the key r_i·v_i is never stored) and computes its logits for every later use with one
  product against those uses' queries;
- use j takes a softmax over its row of logits and the weighted sum as one batched product
  over the stack, plus at most one source outside the stack (Block AttnRes's running partial,
  which is a source of exactly one sublayer); its backward stores its output gradient g_j and
  its logit gradients, and computes the weight gradients vᵢᵀg_j as one batched product;
- the gradient of source i is made once, when autograd reaches it (after every use of i):
  Σ_j α_ji·g_j is one batched product over the stored g_j, the query and norm terms are one
  product over the logit gradients, and so is the queries' gradient.

Autograd sees a chain of tokens (0-d tensors): `open` (the first source and every query) →
`push` → … and each use hangs off the latest token, so the engine runs a source's backward only
after every use of it. The buffers V, r and the weights are saved by the use that closes the
stack (the output aggregation), which is what `saved_tensors_hooks` and the cost model count.
Every (source, use) pair costs one read of the source forward and two backward (the weight
gradient and the α-term), against about ten per-source passes when each use is its own
function (see docs/architecture.md).

FLOP counting: for stack sources every term is a matrix product — the logits and the weighted
sum forward (2·d each per pair), and backward the weight gradients, the α-term, the query term
and the queries' gradient (8·d per pair): exactly the analytic 4·d per pair forward and twice
that backward — except that a sum with a single term (a use that sees one stack source, a
source with one use) is an element-wise product. For the source outside the stack, the logit
forward and the query gradient backward are products (2·d each); its weighted add and value
gradient are element-wise.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from workers.model.depth_attention import rms_scale
from workers.model.layers import upcast

#: Inference takes a source's logits as per-row dot products up to this many elements of
#: their products (a decoding step, a short prefill): row-invariant (`depth_attention`'s
#: docstring). Above it, and when training, one matrix product (a matrix-vector product with
#: one query is always avoided in inference).
ROW_PRODUCT_LIMIT = 1 << 21


def _products(x: torch.Tensor, Q: torch.Tensor, inference: bool) -> torch.Tensor:
    """Every row of x (N, d) against every query of Q (k, d): (N, k)."""
    if inference and (Q.shape[0] == 1 or x.numel() * Q.shape[0] <= ROW_PRODUCT_LIMIT):
        rows: torch.Tensor = torch.linalg.vecdot(x[:, None, :], Q)
        return rows
    return x @ Q.T


def _combine(weights: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Per token Σ_k weights[:, k]·X[:, k]: (B·T, k) with (B·T, k, d) → (B·T, d), one batched
    product; a single term is a plain product (a batched product with one term is slow)."""
    if X.shape[1] == 1:
        return X[:, 0] * weights
    return torch.bmm(weights[:, None, :], X).squeeze(1)


class _Workspace:
    """Reuse of the stack's large buffers between forward passes on the CPU.

    A buffer of tens of MB is handed to a fresh mapping by the C allocator and every page of it
    faults on first touch, every step: at the benchmark shape that costs as much as the
    arithmetic on the buffer. Buffers go back here when the stack that took them is freed (the
    scratch of the backward pass as soon as the pass ends) and are taken again by the next
    forward of the same shape. At most `keep` per shape are held (a training loop keeps the
    previous step's graph alive while it runs the next forward) and at most `limit` bytes in
    all: the shapes used least recently go first, so a worker that trains one candidate after
    another holds only the latest ones' buffers. CUDA has its own caching allocator, so only
    CPU buffers are kept."""

    def __init__(self, keep: int = 2, limit: int = 512 << 20) -> None:
        self.keep, self.limit = keep, limit
        self.free: OrderedDict[tuple[Any, ...], list[torch.Tensor]] = OrderedDict()
        self.held = 0  # bytes
        self.lock = threading.Lock()

    def take(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        if device.type == "cpu":
            with self.lock:
                key = (shape, dtype)
                free = self.free.get(key)
                if free:
                    self.free.move_to_end(key)
                    t = free.pop()
                    self.held -= t.nbytes
                    return t
        with torch.inference_mode(False):  # a normal tensor: any later forward may reuse it
            return torch.empty(shape, dtype=dtype, device=device)

    def give(self, *tensors: torch.Tensor | None) -> None:
        with self.lock:
            for t in tensors:
                # (not a traced fake tensor, not a CUDA one, not one that would crowd out all,
                # not an inference tensor, which a forward with autograd could not write to)
                if type(t) is not torch.Tensor or t.device.type != "cpu" or t.is_inference():
                    continue
                key = (tuple(t.shape), t.dtype)
                free = self.free.setdefault(key, [])
                self.free.move_to_end(key)
                if len(free) < self.keep and t.nbytes <= self.limit // 4:
                    free.append(t)
                    self.held += t.nbytes
            while self.held > self.limit:  # evict the least recently used shapes
                _, evicted = self.free.popitem(last=False)
                self.held -= sum(e.nbytes for e in evicted)


WORKSPACE = _Workspace()


class DepthStack:
    """Depth attention of one forward pass with static queries.

    queries: (U, d), the query of every use in order (a learned key gain folded in); slots:
    how many sources will be pushed (the first is given here); key_norm: keys are the
    RMS-normalised sources (else the raw ones); gate: "softmax" or "sigmoid". Call `push` for
    each new source and `attend` for each use, in forward order; the last use (the aggregation)
    closes the stack. This handle holds the latest token; the buffers live in a `_Stack` that only
    the autograd nodes hold, so no reference cycle keeps them from the workspace."""

    def __init__(
        self, queries: torch.Tensor, first: torch.Tensor, slots: int, key_norm: bool, gate: str
    ) -> None:
        if gate not in ("softmax", "sigmoid"):
            raise ValueError(f"gate: unknown value {gate!r}")
        self.stack = _Stack(slots, key_norm, gate)
        # without autograd (inference) the arithmetic runs directly: no tokens, no nodes
        self.graph = torch.is_grad_enabled()
        if self.graph:
            self.token = _Open.apply(queries, first, self.stack)  # type: ignore[no-untyped-call]
        else:
            self.stack.open(queries, first)

    def push(self, value: torch.Tensor) -> None:
        """Add a source (B, T, d); it is attended by every later use."""
        if self.stack.n == self.stack.slots:
            raise ValueError(f"DepthStack: all {self.stack.slots} slots are taken")
        if self.graph:
            self.token = _Push.apply(self.token, value, self.stack)  # type: ignore[no-untyped-call]
        else:
            self.stack.write(value)

    def attend(
        self, use: int, extra: torch.Tensor | None = None, extra_scale: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Use `use` (its row of queries; uses come in increasing order, the last one closes
        the stack): softmax (or sigmoid) attention over the stack and, if given, one more
        source `extra` (B, T, d) with its key scale (None: no key norm)."""
        uses = self.stack.Q.shape[0]
        if not self.stack.uses <= use < uses:
            raise ValueError(f"DepthStack: use {use} is not in {self.stack.uses}..{uses - 1}")
        if self.graph:
            out: torch.Tensor = _Attend.apply(self.token, extra, extra_scale, self.stack, use)  # type: ignore[no-untyped-call]
            return out
        h, *_ = self.stack.attend(use, extra, extra_scale)
        return h


class _Stack:
    """The buffers and arithmetic behind a `DepthStack`."""

    def __init__(self, slots: int, key_norm: bool, gate: str) -> None:
        self.slots, self.key_norm, self.gate = slots, key_norm, gate

    # -- forward arithmetic ------------------------------------------------------------------
    def open(self, queries: torch.Tensor, first: torch.Tensor, backward: bool = False) -> None:
        """Allocate and push the first source; `backward`: keep what the backward pass reads
        (the key scales and the weights)."""
        with torch.autocast(first.device.type, enabled=False):
            self._allocate(queries, first, backward)
            self.write(first)

    def _allocate(self, queries: torch.Tensor, first: torch.Tensor, backward: bool) -> None:
        B, T, d = first.shape
        self.shape = (B, T, d)
        self.dtype = first.dtype  # the sources' dtype (fp32 under autocast)
        acc = torch.float64 if first.dtype == torch.float64 else torch.float32
        self.Q = queries.detach().to(acc)  # (U, d)
        U, dev = self.Q.shape[0], first.device
        take = WORKSPACE.take
        self.V = take((B * T, self.slots, d), first.dtype, dev)
        self.R = take((B * T, self.slots), acc, dev) if self.key_norm and backward else None
        self.logits: torch.Tensor | None = take((B * T, U, self.slots), acc, dev)
        self.A = take((B * T, U, self.slots), acc, dev).zero_() if backward else None
        self.first_use: list[int] = []
        self.n = 0  # sources pushed
        self.uses = 0  # uses made
        self._reset_backward()

    def __del__(self) -> None:  # (a stack that never opened, e.g. under tracing, holds none)
        WORKSPACE.give(*(getattr(self, k, None) for k in ("V", "R", "A", "logits", "G", "DL")))

    def _reset_backward(self) -> None:
        """Hand the backward scratch back (also before a second backward of a kept graph)."""
        WORKSPACE.give(getattr(self, "G", None), getattr(self, "DL", None))
        self.G: torch.Tensor | None = None  # (B·T, U, d) every use's output gradient
        self.DL: torch.Tensor | None = None  # (B·T, U, slots) logit gradients
        self.dQ: torch.Tensor | None = None  # (U, d)
        self.done: list[bool] = []

    def write(self, value: torch.Tensor) -> int:
        """Push a source: its slot, key scale and logits for every later use."""
        i, f = self.n, self.uses
        B, T, d = self.shape
        v = value.reshape(B * T, d)
        self.V[:, i] = v
        assert self.logits is not None
        logits = _products(upcast(v), self.Q[f:], inference=self.A is None)  # (B·T, U − f)
        if self.key_norm:
            r = rms_scale(v)
            logits.mul_(r[:, None])
            if self.R is not None:
                self.R[:, i] = r
        self.logits[:, f:, i] = logits
        self.first_use.append(f)
        self.n += 1
        return i

    def attend(
        self, j: int, extra: torch.Tensor | None, extra_scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Use j over the m sources pushed so far (and `extra`): its input h (B, T, d) and the
        extra source's logit (B·T,). The extra source takes the column of the next slot,
        which no use up to j reads (Block AttnRes: the block its partial sum will become):
        its logit and weight sit there. The last use closes the stack."""
        m = self.n
        self.uses = j + 1
        B, T, d = self.shape
        assert self.logits is not None
        with torch.autocast(self.V.device.type, enabled=False):
            row = self.logits[:, j]  # (B·T, slots)
            p = s = None
            k = m
            if extra is not None:
                if m == self.slots:
                    raise ValueError("DepthStack: a source outside the stack needs a free slot")
                p = upcast(extra.reshape(B * T, d))
                s = _products(p, self.Q[j : j + 1], inference=self.A is None).squeeze(1)
                if extra_scale is not None:
                    s = s * extra_scale.reshape(-1)
                row[:, m] = s
                k = m + 1
            weights = self._gate(row[:, :k])
            if self.A is not None:
                self.A[:, j, :k] = weights
            h = _combine(weights[:, :m].to(self.dtype), self.V[:, :m])
            if p is not None:
                h.addcmul_(p.to(self.dtype), weights[:, m:].to(self.dtype))
        if j == self.Q.shape[0] - 1:  # closed: the logits are spent
            WORKSPACE.give(self.logits)
            self.logits = None
        return h.view(B, T, d), s

    def _gate(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.softmax(dim=-1) if self.gate == "softmax" else logits.sigmoid()

    # -- backward arithmetic -----------------------------------------------------------------
    def _grad_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.G is None:
            B, T, d = self.shape
            U, acc, dev = self.Q.shape[0], self.Q.dtype, self.V.device
            self.G = WORKSPACE.take((B * T, U, d), acc, dev)
            self.DL = WORKSPACE.take((B * T, U, self.slots), acc, dev)
            self.dQ = torch.zeros(U, d, dtype=acc, device=dev)
            self.done = [False] * U
        assert self.DL is not None and self.dQ is not None
        return self.G, self.DL, self.dQ

    def _source_grad(self, i: int) -> torch.Tensor:
        """dL/dv_i over every use j ≥ first_use[i], with s_ji = r_i·(q_jᵀv_i) and
        r_i = (mean(v_i²) + ε)^(−1/2):
        dv_i = Σ_j α_ji·g_j + r_i·u − (r_i²/d)·(v_iᵀu)·v_i,  u = Σ_j dl_ji·q_j;
        dq_j += dl_ji·r_i·v_i (summed over tokens)."""
        G, DL, dQ = self._grad_buffers()
        f = self.first_use[i]
        for j in range(f, len(self.done)):  # uses that got no gradient contribute nothing
            if not self.done[j]:
                G[:, j] = 0
                DL[:, j] = 0
                self.done[j] = True
        B, T, d = self.shape
        assert self.A is not None
        a = self.A[:, f:, i].contiguous()  # (B·T, n); a strided one sends bmm down a slow path
        dv = _combine(a, G[:, f:])  # Σ_j α_ji·g_j, (B·T, d)
        dl = DL[:, f:, i]
        if self.R is not None:
            dl = dl * self.R[:, i : i + 1]  # dl·r
        v = upcast(self.V[:, i])
        u = dl @ self.Q[f:]  # (B·T, d)
        dv.add_(u)
        if self.R is not None:
            r = self.R[:, i]
            coef = torch.linalg.vecdot(v, u).mul_(r.square()).div_(-d)
            dv.addcmul_(v, coef[:, None])
        dQ[f:] += dl.T @ v  # (an in-place addmm_ would hide the product from FLOP counters)
        return dv.view(B, T, d).to(self.dtype)


class _Open(torch.autograd.Function):
    """Allocates the stack and pushes its first source; backward: that source's gradient and
    the gradient of every query (it runs last)."""

    @staticmethod
    def forward(ctx: Any, queries: torch.Tensor, first: torch.Tensor, stack: _Stack) -> Any:
        stack.open(queries, first, backward=True)
        ctx.stack = stack
        return first.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _token: torch.Tensor | None) -> Any:
        stack: _Stack = ctx.stack
        d_first = stack._source_grad(0)
        _, _, dQ = stack._grad_buffers()
        stack._reset_backward()  # a second backward (retain_graph) starts afresh
        return dQ.to(stack.Q.dtype), d_first, None


class _Push(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, token: torch.Tensor, value: torch.Tensor, stack: _Stack) -> Any:
        with torch.autocast(value.device.type, enabled=False):
            ctx.i = stack.write(value)
        ctx.stack = stack
        return token.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _token: torch.Tensor | None) -> Any:
        return None, ctx.stack._source_grad(ctx.i), None


class _Attend(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        token: torch.Tensor,
        extra: torch.Tensor | None,
        extra_scale: torch.Tensor | None,
        stack: _Stack,
        use: int,
    ) -> torch.Tensor:
        h, s = stack.attend(use, extra, extra_scale)
        j, m = use, stack.n
        ctx.stack, ctx.j, ctx.m = stack, j, m
        ctx.has_extra = extra is not None
        saved = [extra, extra_scale, s]
        if stack.logits is None:  # it closed the stack: the buffers every backward reads
            saved += [stack.V, stack.R, stack.A]  # are saved here, once
        ctx.save_for_backward(*saved)
        return h

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        stack: _Stack = ctx.stack
        j, m = ctx.j, ctx.m
        extra, extra_scale, s = ctx.saved_tensors[:3]
        G, DL, dQ = stack._grad_buffers()
        B, T, d = stack.shape
        # (a broadcast gradient, zero strides, would send the batched products below down a
        # per-token loop: made contiguous, which is free when it already is)
        g = upcast(grad).contiguous().view(B * T, d)
        G[:, j] = g
        stack.done[j] = True
        V = stack.V[:, :m]
        # vᵢᵀg as a row times a matrix, (1, d)·(d, m): the form batched products run fastest
        dw = upcast(torch.bmm(g.to(stack.dtype)[:, None, :], V.transpose(1, 2)).squeeze(1))
        A = stack.A
        assert A is not None  # (kept for the backward)
        w = A[:, j, :m]
        p = alpha = dw_p = None
        if ctx.has_extra:
            p = upcast(extra.reshape(B * T, d))
            alpha = A[:, j, m]
            dw_p = torch.linalg.vecdot(p, g)
        if stack.gate == "softmax":  # dl = α·(dw − Σ α·dw), over the stack and the extra
            mean = (w * dw).sum(-1)
            if alpha is not None and dw_p is not None:
                mean.addcmul_(alpha, dw_p)
            dl = w * (dw - mean[:, None])
        else:
            dl = dw * w * (1 - w)
        DL[:, j, :m] = dl
        if alpha is None:
            return (None,) * 5
        assert p is not None and dw_p is not None
        dl_p = alpha * (dw_p - mean) if stack.gate == "softmax" else dw_p * alpha * (1 - alpha)
        # the source outside the stack, s = r·(qᵀp): dp = α·g + dl·r·q − (dl·s·r/d)·r·p
        q = stack.Q[j]
        dlr = dl_p if extra_scale is None else dl_p * extra_scale.reshape(-1)
        dp = g * alpha[:, None]
        dp.addcmul_(q[None, :], dlr[:, None])
        if extra_scale is not None:
            dp.addcmul_(p, (dlr * s * extra_scale.reshape(-1) / -d)[:, None])
        dQ[j] += (dlr[None, :] @ p).squeeze(0)
        return None, dp.view(B, T, d).to(extra.dtype), None, None, None
