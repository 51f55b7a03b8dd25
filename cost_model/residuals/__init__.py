"""The residual variant is the unit: one module per variant family, each variant a `Residual`
that prices its own wiring (sources, mixing parameters, FLOPs, saved activations, residual I/O,
pipeline payload). `params`, `flops`, `memory`, `io`, `comm` and `depth` keep the Transformer
terms and ask `residual_of(cfg)` for the variant's.

A new variant: a module here with a concrete `Residual` subclass that sets `name`, and that
name in `cost_model._config.Variant`. `RESIDUALS` finds every concrete subclass in this
package's modules; `tests/cost_model/test_residuals.py` checks that it covers exactly the
Literal's names.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from cost_model.residuals._base import ArchSizes, PipelinePayload, Residual, SublayerIO
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


def _discover() -> dict[str, Residual]:
    """One instance of every concrete `Residual` subclass defined in this package's modules,
    by its `name`. A concrete subclass must set its own `name`, and no two may share one."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, Residual] = {}
    pending = Residual.__subclasses__()
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if inspect.isabstract(cls) or not cls.__module__.startswith(f"{__name__}."):
            continue
        if "name" not in vars(cls):
            raise TypeError(f"{cls.__qualname__} is a concrete Residual without its own name")
        if cls.name in found:
            raise TypeError(f"two residuals are named {cls.name!r}")
        found[cls.name] = cls()
    return dict(sorted(found.items()))


#: Every variant's implementation, by its name in `cost_model._config.Variant`.
RESIDUALS: Mapping[str, Residual] = MappingProxyType(_discover())

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
#: Per variant, the `ArchConfig` fields it takes that not every variant does.
VARIANT_FIELDS: dict[str, tuple[str, ...]] = {
    n: (("block_size",) if r.has_block_size else ()) + (("mhc_streams",) if r.has_streams else ())
    for n, r in RESIDUALS.items()
}
#: Variants whose wiring has parameters of its own (AttnRes pseudo-queries and key-norm gains,
#: mHC-lite's coefficient projections and biases, DenseFormer's weights): those a training
#: run's `depth_lr_mult` applies to (`Residual.has_depth_mixing`).
DEPTH_MIXED: frozenset[str] = frozenset(n for n, r in RESIDUALS.items() if r.has_depth_mixing)


def residual_of(cfg: ArchSizes) -> Residual:
    """The implementation of `cfg.variant` (an `ArchConfig` or an `ArchGrid`)."""
    return RESIDUALS[cfg.variant]


__all__ = [
    "ATTNRES_VARIANTS",
    "BLOCK_SIZED",
    "DEPTH_MIXED",
    "FULL_ATTNRES_FAMILY",
    "RESIDUALS",
    "STREAMED",
    "VARIANT_FIELDS",
    "ArchSizes",
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
