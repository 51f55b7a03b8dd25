"""Residual-path memory I/O per token per sublayer (Attention Residuals, Table 1).

Counts the elements a sublayer's residual wiring reads and writes per token, beyond the
sublayer's own computation. The paper's table is the special case L = 128, N = 8, S = 16 and
m = 4: standard 3d, mHC (8m+2)·d + 2m² + 4m = 34d + 48, Full AttnRes (two-phase) (S+N)·d =
24d, Block AttnRes (two-phase) (N/S + 5)·d = 5.5d.

Each variant counts its own (`Residual.sublayer_io` in `cost_model.residuals`). Conventions (as
the paper's): Full AttnRes reads each source twice, once as a key and once as a value; Block
AttnRes reads it once (the two-phase kernel fuses both uses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cost_model._config import _Derived
from cost_model.residuals import residual_of
from cost_model.residuals.attnres import default_schedule_block

__all__ = ["SCHEDULES", "ResidualIO", "default_schedule_block", "residual_io"]

SCHEDULES: tuple[str, ...] = ("two_phase", "naive")


@dataclass(frozen=True)
class ResidualIO:
    """Per token per sublayer: elements moved as multiples of d, plus scalar elements."""

    d_multiple: Any  # the table's "…·d" coefficient
    scalars: Any  # the table's additive scalars (mHC's coefficients)
    d_model: Any
    dtype_bytes: int

    @property
    def elements(self) -> Any:
        return self.d_multiple * self.d_model + self.scalars

    @property
    def bytes(self) -> Any:
        return self.elements * self.dtype_bytes


def residual_io(
    cfg: _Derived, schedule: str = "two_phase", schedule_block: Any = None
) -> ResidualIO:
    """Residual-path I/O per token per sublayer for the variant of `cfg`, as the variant counts
    it (`Residual.sublayer_io`):

    - standard residual: read h and f(h), write h: 3d.
    - mHC with m streams (arXiv 2512.24880, counted as in Attention Residuals Table 1):
      (8m+2)·d + 2m² + 4m.
    - Block AttnRes, two-phase: Phase 1 reads the N finished blocks once for the block's S
      queries (N/S per sublayer); Phase 2 reads the Phase-1 partial result and the running
      partial, writes the input, reads f and writes the new partial: (N/S + 5)·d.
    - Full AttnRes and its ablations, two-phase with schedule block S (N = L/S batches):
      (S + N)·d.
    - `schedule="naive"` (any AttnRes variant): every source read as key and value at every
      sublayer, plus writing the input, reading f and writing the new source:
      (2·Σk/L + 3)·d, with Σk the attended sources of `depth.attended_sources_total`.
    - DenseFormer: the standard 3d, plus after each block a weighted average reading its
      i + 1 sources and writing one, amortised over the block's two sublayers:
      3d + (L_b + 5)/4·d.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: unknown value {schedule!r}; expected one of {SCHEDULES}")
    terms = residual_of(cfg).sublayer_io(cfg, schedule, schedule_block)
    return ResidualIO(terms.d_multiple, terms.scalars, cfg.d_model, cfg.dtype_bytes)
