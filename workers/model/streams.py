"""mHC-lite's stream arithmetic (arXiv 2601.05732) as custom autograd functions.

The state of a token is n streams X ∈ R^{n×d}. At each sublayer boundary the previous
sublayer's update and the next sublayer's coefficients are one function (`_Transition`):

    X' = H_res·X + H_post ⊗ f            (the update after sublayer l)
    r  = 1/rms(vec X'),  c = r·(vec X')ᵀW  (the coefficients of sublayer l+1)
    H_pre = σ(α_pre·c_pre + b_pre), H_post' = 2σ(α_post·c_post + b_post),
    H_res' = Σ_π softmax(α_res·c_res + b_res)_π·P_π,   h = H_preᵀX'

Why custom: autograd of the plain expression saves the normalised copy of the n·d state per
sublayer and differentiates the RMS norm through pow/mean/rsqrt, and the two halves of a
boundary each hand back their own gradient of X', which autograd then adds — three extra
passes over the largest tensor of the model. Here the norm is a per-token scalar folded into
the n·d×k product (c = r·(XW), so the normalised copy never exists), its gradient is closed
form, and the gradient of X' is built in one buffer. What the backward keeps: the states X and
X', the sublayer output f, and per token the small tensors (c, r, H_pre, σ(post), the
permutation weights, H_res, H_post): k + 3n + n! + n² + 1 values, as `cost_model.memory`
counts. Computation is in the state's dtype (fp32, the residual stream's), autocast off.

FLOP counting (what `torch.utils.flop_counter` sees): every term of the analytic count is a
matrix product except the outer products H_post ⊗ f (forward) and H_pre ⊗ dh (backward), which
are element-wise; the constant permutation matrices get no gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.model import layers


def _coefficients(
    X: torch.Tensor, W: torch.Tensor, gates: torch.Tensor, bias: torch.Tensor, perms: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """From the state X (N, n, d): r (N,), c (N, k), H_pre (N, n), σ(post) (N, n), the
    permutation weights (N, n!), H_res (N, n·n) and h = H_preᵀX (N, d)."""
    N, n, d = X.shape
    flat = X.view(N, n * d)
    r = torch.linalg.vector_norm(flat, dim=-1).square_().div_(n * d).add_(layers.NORM_EPS)
    r = r.rsqrt_()
    c = (flat @ W).mul_(r[:, None])
    g_pre, g_post, g_res = gates.unbind(0)
    pre = torch.sigmoid(torch.addcmul(bias[:n], c[:, :n], g_pre))
    s_post = torch.sigmoid(torch.addcmul(bias[n : 2 * n], c[:, n : 2 * n], g_post))
    mix = torch.softmax(torch.addcmul(bias[2 * n :], c[:, 2 * n :], g_res), dim=-1)
    H = mix @ perms.reshape(-1, n * n)
    h = torch.bmm(pre[:, None, :], X).view(N, d)
    return r, c, pre, s_post, mix, H, h


def _coefficients_backward(
    X: torch.Tensor,
    W: torch.Tensor,
    gates: torch.Tensor,
    perms: torch.Tensor,
    saved: tuple[torch.Tensor, ...],
    d_h: torch.Tensor,
    d_H: torch.Tensor,
    d_post: torch.Tensor,
    d_X: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradient of X (N, n, d) — `d_X` (from X's other use) plus this use's — and of W,
    the gates and the biases."""
    r, c, pre, s_post, mix = saved
    N, n, d = X.shape
    k = W.shape[1]
    flat = X.view(N, n * d)
    # per-token dot products as a row times a matrix, the form batched products run fastest
    d_pre = torch.bmm(d_h[:, None, :], X.transpose(1, 2)).view(N, n)
    a_pre = d_pre.mul_(pre * (1 - pre))
    a_post = d_post * (2 * s_post * (1 - s_post))
    d_mix = d_H @ perms.reshape(-1, n * n).T
    a_res = mix * (d_mix - (mix * d_mix).sum(-1, keepdim=True))
    d_a = torch.cat([a_pre, a_post, a_res], dim=1)  # (N, k)
    d_gates = torch.stack(
        [(a_pre * c[:, :n]).sum(), (a_post * c[:, n : 2 * n]).sum(), (a_res * c[:, 2 * n :]).sum()]
    )
    d_bias = d_a.sum(0)
    g_pre, g_post, g_res = gates.unbind(0)
    d_c = d_a * torch.cat([g_pre.expand(n), g_post.expand(n), g_res.expand(k - 2 * n)])
    d_z = d_c * r[:, None]  # c = r·z, z = (vec X)ᵀW
    # (the forms measured fastest on CPU: a wide-by-tall product transposed, and a product
    # plus an in-place add rather than an out-of-place addmm, which copies its input first)
    d_W = (d_z.T @ flat).T
    grad = d_z @ W.T
    if d_X is not None:
        grad.add_(d_X.reshape(N, n * d))
    grad.view(N, n, d).addcmul_(pre[:, :, None], d_h[:, None, :])  # h = H_preᵀX
    # through r = (mean(X²) + ε)^(-1/2): dX += −(Σ_k dc_k·c_k)·r²/(n·d)·X
    coef = (d_c * c).sum(-1, keepdim=True).mul_(r[:, None].square()).div_(-(n * d))
    grad.addcmul_(flat, coef)
    return grad.view(N, n, d), d_W, d_gates, d_bias


def _update(X: torch.Tensor, H: torch.Tensor, post: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """X' = H_res·X + H_post ⊗ f for X (N, n, d), H (N, n·n), post (N, n), f (N, d)."""
    N, n, _ = X.shape
    out = torch.bmm(H.view(N, n, n), X)
    return out.addcmul_(post[:, :, None], f[:, None, :])


def _update_backward(
    X: torch.Tensor, H: torch.Tensor, post: torch.Tensor, f: torch.Tensor, d_out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    N, n, d = X.shape
    d_X = torch.bmm(H.view(N, n, n).transpose(1, 2), d_out)
    d_H = torch.bmm(d_out, X.transpose(1, 2)).view(N, n * n)
    d_post = torch.bmm(f[:, None, :], d_out.transpose(1, 2)).view(N, n)
    d_f = torch.bmm(post[:, None, :], d_out).view(N, d)
    return d_X, d_H, d_post, d_f


# An incoming gradient may arrive broadcast (zero strides, e.g. from a sum): the batched
# products then fall back to one product per token, so it is made contiguous first (free when
# it already is).
def _flat(t: torch.Tensor | None, *shape: int) -> torch.Tensor | None:
    return None if t is None else t.contiguous().view(*shape)


def _zeros_if_none(t: torch.Tensor | None, like: torch.Tensor, *shape: int) -> torch.Tensor:
    return like.new_zeros(shape) if t is None else t.contiguous().view(*shape)


class _Enter(torch.autograd.Function):
    """The first sublayer's coefficients from the initial state: (h, H_res, H_post)."""

    @staticmethod
    def forward(
        ctx: Any,
        X: torch.Tensor,
        W: torch.Tensor,
        gates: torch.Tensor,
        bias: torch.Tensor,
        perms: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, n, d = X.shape
        with torch.autocast(X.device.type, enabled=False):
            r, c, pre, s_post, mix, H, h = _coefficients(
                X.view(B * T, n, d), W, gates, bias, perms.to(X.dtype)
            )
        ctx.save_for_backward(X, W, gates, perms, r, c, pre, s_post, mix)
        return h.view(B, T, d), H.view(B, T, n, n), (2 * s_post).view(B, T, n)

    @staticmethod
    def backward(ctx: Any, d_h: Any, d_H: Any, d_post: Any) -> Any:
        X, W, gates, perms, *saved = ctx.saved_tensors
        B, T, n, d = X.shape
        N = B * T
        d_X, d_W, d_gates, d_bias = _coefficients_backward(
            X.view(N, n, d),
            W,
            gates,
            perms.to(X.dtype),
            tuple(saved),
            _zeros_if_none(d_h, X, N, d),
            _zeros_if_none(d_H, X, N, n * n),
            _zeros_if_none(d_post, X, N, n),
            None,
        )
        return d_X.view(B, T, n, d), d_W, d_gates, d_bias, None


class _Transition(torch.autograd.Function):
    """One sublayer boundary: the update with the previous sublayer's output f and the next
    sublayer's coefficients. Returns (X', h, H_res, H_post)."""

    @staticmethod
    def forward(
        ctx: Any,
        X: torch.Tensor,
        H: torch.Tensor,
        post: torch.Tensor,
        f: torch.Tensor,
        W: torch.Tensor,
        gates: torch.Tensor,
        bias: torch.Tensor,
        perms: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        B, T, n, d = X.shape
        N = B * T
        with torch.autocast(X.device.type, enabled=False):
            X1 = _update(X.view(N, n, d), H.reshape(N, n * n), post.reshape(N, n), f.reshape(N, d))
            r, c, pre, s_post, mix, H1, h = _coefficients(X1, W, gates, bias, perms.to(X.dtype))
        ctx.save_for_backward(X, H, post, f, X1, W, gates, perms, r, c, pre, s_post, mix)
        return X1.view(B, T, n, d), h.view(B, T, d), H1.view(B, T, n, n), (2 * s_post).view(B, T, n)

    @staticmethod
    def backward(ctx: Any, d_X1: Any, d_h: Any, d_H1: Any, d_post1: Any) -> Any:
        X, H, post, f, X1, W, gates, perms, *saved = ctx.saved_tensors
        B, T, n, d = X.shape
        N = B * T
        d_state, d_W, d_gates, d_bias = _coefficients_backward(
            X1,
            W,
            gates,
            perms.to(X.dtype),
            tuple(saved),
            _zeros_if_none(d_h, X, N, d),
            _zeros_if_none(d_H1, X, N, n * n),
            _zeros_if_none(d_post1, X, N, n),
            _flat(d_X1, N, n * d),
        )
        d_X, d_H, d_post, d_f = _update_backward(
            X.view(N, n, d), H.reshape(N, n * n), post.reshape(N, n), f.reshape(N, d), d_state
        )
        return (
            d_X.view(B, T, n, d),
            d_H.view(B, T, n, n),
            d_post.view(B, T, n),
            d_f.view(B, T, d).to(f.dtype),
            d_W,
            d_gates,
            d_bias,
            None,
        )


class _Update(torch.autograd.Function):
    """The last sublayer's update alone: X' = H_res·X + H_post ⊗ f."""

    @staticmethod
    def forward(
        ctx: Any, X: torch.Tensor, H: torch.Tensor, post: torch.Tensor, f: torch.Tensor
    ) -> torch.Tensor:
        B, T, n, d = X.shape
        N = B * T
        with torch.autocast(X.device.type, enabled=False):
            out = _update(X.view(N, n, d), H.reshape(N, n * n), post.reshape(N, n), f.reshape(N, d))
        ctx.save_for_backward(X, H, post, f)
        return out.view(B, T, n, d)

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> Any:
        X, H, post, f = ctx.saved_tensors
        B, T, n, d = X.shape
        N = B * T
        d_X, d_H, d_post, d_f = _update_backward(
            X.view(N, n, d),
            H.reshape(N, n * n),
            post.reshape(N, n),
            f.reshape(N, d),
            d_out.contiguous().view(N, n, d),  # broadcast over the streams: the model sums them
        )
        return (
            d_X.view(B, T, n, d),
            d_H.view(B, T, n, n),
            d_post.view(B, T, n),
            d_f.view(B, T, d).to(f.dtype),
        )


def enter(
    X: torch.Tensor, W: torch.Tensor, gates: torch.Tensor, bias: torch.Tensor, perms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, H_res, H_post) of the first sublayer from the initial state X (B, T, n, d)."""
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _Enter.apply(X, W, gates, bias, perms)  # type: ignore[no-untyped-call]
    return out


def transition(
    X: torch.Tensor,
    H: torch.Tensor,
    post: torch.Tensor,
    f: torch.Tensor,
    W: torch.Tensor,
    gates: torch.Tensor,
    bias: torch.Tensor,
    perms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X', h, H_res', H_post') across one sublayer boundary (see the module docstring)."""
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] = _Transition.apply(  # type: ignore[no-untyped-call]
        X, H, post, f.to(X.dtype), W, gates, bias, perms
    )
    return out


def update(X: torch.Tensor, H: torch.Tensor, post: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """X' = H_res·X + H_post ⊗ f (the last sublayer's update)."""
    out: torch.Tensor = _Update.apply(X, H, post, f.to(X.dtype))  # type: ignore[no-untyped-call]
    return out
