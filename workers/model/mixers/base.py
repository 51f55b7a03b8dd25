"""The contract of a residual variant on the torch side: `DepthMixer`.

A mixer is the residual wiring of the model's single loop over sublayers (L = 2·L_b of them,
attention then MLP per block, 0-based l). `run(emb, sublayer, schedule)` takes the token
embedding and f_l as `sublayer(l, h_l)` and returns the hidden state handed to the final norm.

Every variant has two implementations of `run`, chosen when the mixer is made (`impl`):

- `"reference"`: `reference(emb, sublayer)`, the variant's definition in plain autograd, as
  short as the paper's equations allow. It is what the fast path is tested against (values
  and gradients, fp64), and the place to read what a variant computes.
- `"fast"` (the default): the same arithmetic as the steps `begin(emb)` (the per-forward
  state), `input(state, l)` (h_l), `record(state, l, out)` (takes f_l(h_l)) and
  `finish(state)`, written for speed and memory (custom autograd functions, a depth stack, a
  two-phase schedule for inference: `depth_stack`, `depth_attention`, `streams`).

A mixer holds parameters but no state between forward passes, so one model serves concurrent
batches; it initialises its own parameters (`reset_parameters`, called at construction and by
the model's; the model builds and initialises it under a fork of the global random
generator, after the Transformer's own parameters, so whatever a mixer draws never shifts the
common parameters' draws), and declares which of its parameters are depth mixing
(`depth_mixing_parameters`: the optimizer's `depth_mixing` group, with its own learning-rate
multiplier and no weight decay). Sources are kept in the embedding's dtype (fp32 under
autocast), as a residual stream is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal, get_args

import torch
from torch import nn

from cost_model import ArchConfig

Sublayer = Callable[[int, torch.Tensor], torch.Tensor]
Impl = Literal["fast", "reference"]
IMPLS: tuple[str, ...] = get_args(Impl)


class DepthMixer(nn.Module, ABC):
    """Base strategy: how sublayer inputs are gathered from earlier outputs.

    `schedules` lists the orders of work `run` accepts (the fast path may add a reordering,
    such as AttnRes's two-phase inference; the reference has only the sequential one);
    `train_schedule` is what the model's `forward` uses, `inference_schedule` what its `step`
    (prefill, decode) uses."""

    schedules: tuple[str, ...] = ("sequential",)
    train_schedule = "sequential"
    inference_schedule = "sequential"

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, not {impl!r}")
        self.impl: Impl = impl
        self.n_sublayers = cfg.n_sublayers

    @abstractmethod
    def reference(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        """The variant's definition: the readable forward the fast path must equal."""

    @abstractmethod
    def reset_parameters(self) -> None:
        """Every parameter's initial value (the docstring lists them)."""

    def depth_mixing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters of the residual wiring, (name, parameter) with the names of the
        mixer's `named_parameters()`: the optimizer puts them in its `depth_mixing` group
        (`workers.train.parameter_groups`; lr · `TrainSpec.depth_lr_mult`, no weight decay).
        Each variant lists its own; the default is none (the standard residual)."""
        return []

    @abstractmethod
    def begin(self, emb: torch.Tensor) -> Any:
        """Fast path: see the module docstring."""

    @abstractmethod
    def input(self, state: Any, l: int) -> torch.Tensor:
        """Fast path: see the module docstring."""

    @abstractmethod
    def record(self, state: Any, l: int, out: torch.Tensor) -> None:
        """Fast path: see the module docstring."""

    @abstractmethod
    def finish(self, state: Any) -> torch.Tensor:
        """Fast path: see the module docstring."""

    def run(
        self, emb: torch.Tensor, sublayer: Sublayer, schedule: str = "sequential"
    ) -> torch.Tensor:
        if schedule not in self.schedules:
            supported = ", ".join(self.schedules)
            raise ValueError(
                f"schedule: {type(self).__name__} ({self.impl}) supports {supported}, "
                f"not {schedule!r}"
            )
        if self.impl == "reference":
            return self.reference(emb, sublayer)
        state = self.begin(emb)
        for l in range(self.n_sublayers):
            out = sublayer(l, self.input(state, l))
            self.record(state, l, out.to(emb.dtype))
        return self.finish(state)
