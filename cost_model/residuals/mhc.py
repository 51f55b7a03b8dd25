"""mHC-lite (arXiv 2601.05732): n residual streams mixed by a doubly stochastic H_res (a convex
combination of the n! permutation matrices), read into each sublayer by H_pre and written back
by H_post, all coefficients computed per token from the stream state."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from cost_model._variant import Variant
from cost_model.residuals._base import (
    FP32,
    ArchSizes,
    PipelinePayload,
    SublayerIO,
    WithoutDepthAttention,
)


def mhc_coefficient_count(streams: int) -> int:
    """Dynamic coefficients per sublayer of mHC-lite (arXiv 2601.05732): H_pre (n), H_post (n)
    and one logit per permutation matrix (n!) for H_res."""
    return 2 * streams + math.factorial(streams)


class MHCLite(WithoutDepthAttention):
    """mHC-lite with n = `cfg.streams` streams (the paper's mHC baseline: n = 4)."""

    name: ClassVar[Variant] = "mhc_lite"
    has_streams: ClassVar[bool] = True
    default_streams: ClassVar[int] = 4  # the paper's mHC baseline is mHC-lite with n = 4
    max_streams: ClassVar[int] = 6  # n! permutation matrices: 720 at n = 6 already

    def live_sources(self, cfg: ArchSizes) -> Any:
        """The n streams."""
        return cfg.streams + 0 * cfg.n_layers

    def cached_sources(self, cfg: ArchSizes) -> Any:
        """The n streams."""
        return cfg.streams + 0 * cfg.n_layers

    def sources_per_stage(self, cfg: ArchSizes, stages: Any) -> Any:
        """No depth representations (the streams are a carried state): 0."""
        return 0 * cfg.n_layers

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """Per sublayer a zero-initialised projection of the flattened, parameter-free
        RMS-normalised stream state (n·d) onto the 2n + n! coefficients, their biases, and
        three learned gate scalars α_pre, α_post, α_res: n·d·(2n+n!) + (2n+n!) + 3."""
        k = mhc_coefficient_count(cfg.streams)
        return (cfg.streams * cfg.d_model * k + k + 3) * cfg.n_sublayers

    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """n streams, k = 2n + n! coefficients: projection 2·n·d·k, H_pre read-out 2·n·d,
        H_res mixing 2·n²·d, H_post write-back 2·n·d per sublayer; the n!·n² permutation mix
        is per token too and included."""
        n, d = cfg.streams, cfg.d_model
        k = mhc_coefficient_count(n)
        per_sublayer = (
            2 * n * d * k + 2 * n * d + 2 * n * n * d + 2 * n * d + (k - 2 * n) * n * n * 2
        )
        return per_sublayer * cfg.n_sublayers

    def mixing_activation_bytes(self, cfg: ArchSizes, tokens: Any, e: int, recompute: str) -> Any:
        """Per sublayer: the n·d stream state (its normalisation is a per-token scalar folded
        into the coefficient product, so no normalised copy is kept), the sublayer output for
        the H_post outer product, and per token the small coefficient tensors: the k
        coefficients, H_pre, σ(post) and H_post (n each), the n! permutation weights, H_res
        (n²) and the 1/rms of the state: k + 3n + n! + n² + 1 values."""
        n, d = cfg.streams, cfg.d_model
        small = mhc_coefficient_count(n) + 3 * n + math.factorial(n) + n * n + 1
        per_sublayer = e * (n * d + d) + FP32 * small
        return per_sublayer * cfg.n_sublayers * tokens

    def sublayer_io(self, cfg: ArchSizes, schedule: str, schedule_block: Any) -> SublayerIO:
        """mHC with m streams (arXiv 2512.24880, counted as in Attention Residuals Table 1):
        (8m+2)·d + 2m² + 4m (any schedule)."""
        m, zero = cfg.streams, 0 * cfg.d_model
        return SublayerIO(8 * m + 2 + zero, 2 * m * m + 4 * m + zero)

    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """Its n streams."""
        return cfg.streams + 0 * blocks_before

    def pipeline_payload(self, cfg: ArchSizes, chunks: Any) -> PipelinePayload:
        """Its n streams at every transition; caching changes nothing."""
        return PipelinePayload(0 * cfg.n_layers, cfg.streams + 0 * cfg.n_layers)
