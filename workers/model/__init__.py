"""Residual-variant language models built from `cost_model.ArchConfig`."""

from workers.model.depth_attention import depth_attend, weighted_sum
from workers.model.depth_stack import DepthStack
from workers.model.layers import NORM_EPS, KVCache, rms_normalize
from workers.model.lm import DepthscopeLM, build_model
from workers.model.mixers import (
    IMPLS,
    MIXERS,
    BlockAttnRes,
    DenseFormer,
    DepthMixer,
    FullAttnRes,
    Impl,
    MHCLite,
    StandardResidual,
    make_mixer,
)

__all__ = [
    "IMPLS",
    "MIXERS",
    "NORM_EPS",
    "BlockAttnRes",
    "DenseFormer",
    "DepthMixer",
    "DepthStack",
    "DepthscopeLM",
    "FullAttnRes",
    "Impl",
    "KVCache",
    "MHCLite",
    "StandardResidual",
    "build_model",
    "depth_attend",
    "make_mixer",
    "rms_normalize",
    "weighted_sum",
]
