"""Residual wiring as strategies: one `DepthMixer` per residual variant, one module per variant
family (`baseline`, `attnres`, `mhc_lite`, `denseformer`), each with its reference forward,
its initialisation and its fast path (`base` states the contract).

`MIXERS` is keyed by every name of `cost_model.VARIANTS` (a test holds the two, and the job
spec, to the same set); `make_mixer(cfg, impl)` builds the mixer of `cfg.variant`.
"""

from __future__ import annotations

from cost_model import ArchConfig
from workers.model.mixers.attnres import AttnRes, BlockAttnRes, FullAttnRes
from workers.model.mixers.base import IMPLS, DepthMixer, Impl, Sublayer
from workers.model.mixers.baseline import StandardResidual
from workers.model.mixers.denseformer import DenseFormer
from workers.model.mixers.mhc_lite import MHCLite

MIXERS: dict[str, type[DepthMixer]] = {
    "baseline": StandardResidual,
    "full_attnres": FullAttnRes,
    "attnres_input_query": FullAttnRes,
    "attnres_sigmoid": FullAttnRes,
    "attnres_no_key_norm": FullAttnRes,
    "block_attnres": BlockAttnRes,
    "mhc_lite": MHCLite,
    "denseformer": DenseFormer,
}


def make_mixer(cfg: ArchConfig, impl: Impl = "fast") -> DepthMixer:
    """The mixer of `cfg.variant`, initialised; `impl` picks its fast path or its reference."""
    return MIXERS[cfg.variant](cfg, impl)


__all__ = [
    "IMPLS",
    "MIXERS",
    "AttnRes",
    "BlockAttnRes",
    "DenseFormer",
    "DepthMixer",
    "FullAttnRes",
    "Impl",
    "MHCLite",
    "StandardResidual",
    "Sublayer",
    "make_mixer",
]
