"""mHC-lite (arXiv 2601.05732): n residual streams mixed by exactly doubly stochastic
matrices, built as convex combinations of permutations."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from cost_model import ArchConfig
from workers.model import streams
from workers.model.layers import rms_normalize
from workers.model.mixers.base import DepthMixer, Impl, Sublayer


class MHCLite(DepthMixer):
    """mHC-lite with n streams X ∈ R^{n×d} per token.

    Per sublayer, from the flattened, parameter-free RMS-normalised state x̃ = norm(vec X):
    c = x̃·W_l (W_l ∈ R^{nd×(2n+n!)}), scaled by three learned gates α_pre, α_post, α_res and
    shifted by biases b_l: H_pre = σ(·) (n), H_post = 2σ(·) (n), H_res = Σ_π softmax(·)_π·P_π
    over the n! permutation matrices — exactly doubly stochastic. Input h = H_preᵀX; update
    X' = H_res·X + H_post ⊗ f(h). The embedding is copied into every stream; the output is the
    sum of the streams.

    Fast path: the update after sublayer l−1 and the coefficients of sublayer l as one custom
    autograd function (`workers/model/streams.py`), which never materialises the normalised
    state and builds the gradient of X' in one buffer."""

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__(cfg, impl)
        n, d, sub = cfg.streams, cfg.d_model, cfg.n_sublayers
        perms = list(itertools.permutations(range(n)))  # perms[0] is the identity
        self.n = n
        self.k = 2 * n + len(perms)
        eye = torch.eye(n)
        self.perm_mats: torch.Tensor
        self.register_buffer(
            "perm_mats", torch.stack([eye[list(p)] for p in perms]), persistent=False
        )
        self.proj = nn.Parameter(torch.empty(sub, n * d, self.k))
        self.bias = nn.Parameter(torch.empty(sub, self.k))
        self.gates = nn.Parameter(torch.empty(sub, 3))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Projections W_l 0; gates 0.01; biases: b_pre = logit(1/n) (h starts as the mean
        of the streams), b_post = 0 (H_post = 1), permutation logits 0 for the identity and
        −8 for the others (H_res ≈ I)."""
        n = self.n
        self.proj.zero_()
        self.gates.fill_(0.01)
        self.bias.zero_()
        self.bias[:, :n] = math.log((1 / n) / (1 - 1 / n))  # σ(b) = 1/n
        self.bias[:, 2 * n :] = -8.0
        self.bias[:, 2 * n] = 0.0  # the identity

    def depth_mixing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Every parameter of the mixer: the coefficient projections W_l (`proj`,
        L×nd×(2n+n!)), their biases b_l (`bias`, L×(2n+n!)) and the gates α_pre, α_post,
        α_res (`gates`, L×3)."""
        return [("proj", self.proj), ("bias", self.bias), ("gates", self.gates)]

    def reference(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        n = self.n
        X = emb[:, :, None, :].expand(-1, -1, n, -1)  # (B, T, n, d)
        for l in range(self.n_sublayers):
            B, T, _, d = X.shape
            c = rms_normalize(X.reshape(B, T, n * d)) @ self.proj[l]  # (B, T, k)
            g, b = self.gates[l], self.bias[l]
            pre = torch.sigmoid(g[0] * c[..., :n] + b[:n])  # (B, T, n)
            post = 2 * torch.sigmoid(g[1] * c[..., n : 2 * n] + b[n : 2 * n])  # (B, T, n)
            mix = torch.softmax(g[2] * c[..., 2 * n :] + b[2 * n :], dim=-1)  # (B, T, n!)
            H_res = torch.einsum("btp,pij->btij", mix, self.perm_mats.to(X.dtype))
            f = sublayer(l, torch.einsum("btn,btnd->btd", pre, X)).to(emb.dtype)
            X = torch.einsum("btij,btjd->btid", H_res, X) + post[..., None] * f[:, :, None, :]
        return X.sum(dim=2)

    # -- fast path -------------------------------------------------------------------------
    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        # The per-sublayer parameters split once: the gradients of one `unbind` are stacked in
        # one go, where an index per sublayer would zero-fill the whole tensor for each.
        split = (self.proj.unbind(0), self.gates.unbind(0), self.bias.unbind(0))
        params = list(zip(*split, strict=True))
        return {"X": emb[:, :, None, :].repeat(1, 1, self.n, 1), "params": params}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        # The update after sublayer l−1 and the coefficients of sublayer l are one function
        # (`streams.transition`): see workers/model/streams.py for why.
        params = (*state["params"][l], self.perm_mats)
        h: torch.Tensor
        if l == 0:
            h, state["H_res"], state["H_post"] = streams.enter(state["X"], *params)
        else:
            X, H, post, f = state["X"], state["H_res"], state["H_post"], state.pop("f")
            state["X"], h, state["H_res"], state["H_post"] = streams.transition(
                X, H, post, f, *params
            )
        return h

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        if l + 1 < self.n_sublayers:
            state["f"] = out  # applied by the next `input`, fused with its coefficients
        else:
            state["X"] = streams.update(state["X"], state["H_res"], state["H_post"], out)

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        X: torch.Tensor = state["X"]
        return X.sum(dim=2)
