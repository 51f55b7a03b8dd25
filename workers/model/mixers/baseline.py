"""The standard PreNorm residual (the baseline every variant is measured against)."""

from __future__ import annotations

import torch
from torch import nn

from workers.model.mixers.base import DepthMixer, Sublayer


class StandardResidual(DepthMixer):
    """PreNorm residual: h_{l+1} = h_l + f_l(h_l). No parameters.

    The fast path is the same arithmetic as the reference, in the mixer's steps."""

    def reference(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        h = emb
        for l in range(self.n_sublayers):
            h = h + sublayer(l, h).to(emb.dtype)
        return h

    def reset_parameters(self) -> None:
        """No parameters."""

    def depth_mixing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """None: the identity path has no parameters."""
        return []

    def begin(self, emb: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": emb}

    def input(self, state: dict[str, torch.Tensor], l: int) -> torch.Tensor:
        return state["h"]

    def record(self, state: dict[str, torch.Tensor], l: int, out: torch.Tensor) -> None:
        state["h"] = state["h"] + out

    def finish(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["h"]
