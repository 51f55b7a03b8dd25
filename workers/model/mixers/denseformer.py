"""DenseFormer (Pagliardini et al., arXiv 2402.02622): depth-weighted averages of the block
outputs after every Transformer block."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cost_model import ArchConfig
from workers.model.depth_attention import weighted_sum
from workers.model.mixers.base import DepthMixer, Impl, Sublayer


class DenseFormer(DepthMixer):
    """A standard residual inside each Transformer block and, after block i, the
    depth-weighted average x̂_i = Σ_{j≤i} α_{i,j}·X_j over the embedding X_0 and the block
    outputs X_1 … X_i; static learned weights, no softmax.

    Fast path: the average as one custom autograd function (`depth_attention.weighted_sum`)
    that saves only the weights and the block outputs."""

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__(cfg, impl)
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.empty(i + 1)) for i in range(1, cfg.n_layers + 1)]
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Identity at init: α_{i,i} = 1 (the newest block output), the others 0."""
        for w in self.weights:
            w.zero_()
            w[-1] = 1.0

    def depth_mixing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Every parameter of the mixer: the depth weights α_{i,·} after block i
        (`weights.{i-1}`, i + 1 of them, i = 1 … L_b)."""
        return [(f"weights.{i}", w) for i, w in enumerate(self.weights)]

    def reference(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        h, outputs = emb, [emb]
        for l in range(self.n_sublayers):
            h = h + sublayer(l, h).to(emb.dtype)
            if l % 2 == 1:  # end of Transformer block i = (l + 1) / 2
                outputs.append(h)
                h = sum(a * X for a, X in zip(self.weights[l // 2], outputs, strict=True))
        return h

    # -- fast path -------------------------------------------------------------------------
    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        return {"h": emb, "outputs": [emb]}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        h: torch.Tensor = state["h"]
        return h

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        h = state["h"] + out
        if l % 2 == 1:
            state["outputs"].append(h)
            h = weighted_sum(self.weights[l // 2], state["outputs"])
        state["h"] = h

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        h: torch.Tensor = state["h"]
        return h
