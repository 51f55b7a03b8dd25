"""The residual variant is the unit: one module per variant family, each variant a `Residual`
that prices its own wiring (sources, mixing parameters, FLOPs, saved activations, residual I/O,
pipeline payload). `params`, `flops`, `memory`, `io`, `comm` and `depth` keep the Transformer
terms and ask `residual_of(cfg)` for the variant's.

A new variant: a `Residual` subclass in a module here, its instance in `RESIDUALS`, its name in
`cost_model._config.Variant` (`tests/cost_model/test_residuals.py` checks the two agree).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from cost_model.residuals._base import PipelinePayload, Residual, SublayerIO
from cost_model.residuals.attnres import (
    AttnRes,
    BlockAttnRes,
    FullAttnRes,
    InputQueryAttnRes,
    NoKeyNormAttnRes,
    SigmoidAttnRes,
)
from cost_model.residuals.baseline import Baseline
from cost_model.residuals.denseformer import DenseFormer
from cost_model.residuals.mhc import MHCLite

if TYPE_CHECKING:
    from cost_model._config import _Derived

#: Every variant's implementation, by its name in `cost_model._config.Variant`.
RESIDUALS: Mapping[str, Residual] = MappingProxyType(
    {
        r.name: r
        for r in (
            Baseline(),
            FullAttnRes(),
            BlockAttnRes(),
            MHCLite(),
            DenseFormer(),
            InputQueryAttnRes(),
            SigmoidAttnRes(),
            NoKeyNormAttnRes(),
        )
    }
)

#: Variants with one softmax (or sigmoid) attention over depth per sublayer, source = every
#: earlier sublayer output (N = L).
FULL_ATTNRES_FAMILY: frozenset[str] = frozenset(
    name for name, r in RESIDUALS.items() if isinstance(r, FullAttnRes)
)
#: Variants with pseudo-queries and a final aggregation over all depth sources.
ATTNRES_VARIANTS: frozenset[str] = frozenset(
    name for name, r in RESIDUALS.items() if isinstance(r, AttnRes)
)
#: Variants that take a block size S (`ArchConfig.block_size`).
BLOCK_SIZED: tuple[str, ...] = tuple(n for n, r in RESIDUALS.items() if r.has_block_size)
#: Variants that take a number of streams n (`ArchConfig.mhc_streams`).
STREAMED: tuple[str, ...] = tuple(n for n, r in RESIDUALS.items() if r.has_streams)


def residual_of(cfg: _Derived) -> Residual:
    """The implementation of `cfg.variant` (an `ArchConfig` or an `ArchGrid`)."""
    return RESIDUALS[cfg.variant]


__all__ = [
    "ATTNRES_VARIANTS",
    "BLOCK_SIZED",
    "FULL_ATTNRES_FAMILY",
    "RESIDUALS",
    "STREAMED",
    "AttnRes",
    "Baseline",
    "BlockAttnRes",
    "DenseFormer",
    "FullAttnRes",
    "InputQueryAttnRes",
    "MHCLite",
    "NoKeyNormAttnRes",
    "PipelinePayload",
    "Residual",
    "SigmoidAttnRes",
    "SublayerIO",
    "residual_of",
]
