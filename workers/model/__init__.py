"""Residual-variant language models built from `cost_model.ArchConfig`."""

from workers.model.depth_attention import depth_attend, weighted_sum
from workers.model.depth_stack import DepthStack
from workers.model.layers import NORM_EPS, KVCache, rms_normalize
from workers.model.lm import DepthscopeLM, build_model
from workers.model.mixers import (
    MIXERS,
    BlockAttnRes,
    DenseFormer,
    DepthMixer,
    FullAttnRes,
    MHCLite,
    StandardResidual,
    make_mixer,
)

__all__ = [
    "MIXERS",
    "NORM_EPS",
    "BlockAttnRes",
    "DenseFormer",
    "DepthMixer",
    "DepthStack",
    "DepthscopeLM",
    "FullAttnRes",
    "KVCache",
    "MHCLite",
    "StandardResidual",
    "build_model",
    "depth_attend",
    "make_mixer",
    "rms_normalize",
    "weighted_sum",
]
