"""The standard residual h_{l+1} = h_l + f_l(h_l): one stream, no parameters of its own."""

from __future__ import annotations

from typing import Any, ClassVar

from cost_model._variant import Variant
from cost_model.residuals._base import ArchSizes, PipelinePayload, SublayerIO, WithoutDepthAttention


class Baseline(WithoutDepthAttention):
    """The standard (PreNorm) residual: the reference every other variant's costs add to."""

    name: ClassVar[Variant] = "baseline"
    has_depth_mixing: ClassVar[bool] = False  # no parameters in the wiring

    def live_sources(self, cfg: ArchSizes) -> Any:
        """1: the residual stream."""
        return 1 + 0 * cfg.n_layers

    def cached_sources(self, cfg: ArchSizes) -> Any:
        """1: the residual stream."""
        return 1 + 0 * cfg.n_layers

    def sources_per_stage(self, cfg: ArchSizes, stages: Any) -> Any:
        """No depth representations: 0."""
        return 0 * cfg.n_layers

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """None."""
        return 0 * cfg.d_model

    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """The residual add is element-wise, not counted: 0."""
        return 0 * cfg.d_model

    def mixing_activation_bytes(self, cfg: ArchSizes, tokens: Any, e: int, recompute: str) -> Any:
        """Nothing beyond a standard residual: 0."""
        return 0 * cfg.d_model

    def sublayer_io(self, cfg: ArchSizes, schedule: str, schedule_block: Any) -> SublayerIO:
        """Read h and f(h), write h: 3d (any schedule)."""
        zero = 0 * cfg.d_model
        return SublayerIO(3 + zero, zero)

    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """The hidden state: 1."""
        return 1 + 0 * blocks_before

    def pipeline_payload(self, cfg: ArchSizes, chunks: Any) -> PipelinePayload:
        """One hidden state per transition; caching changes nothing."""
        return PipelinePayload(0 * cfg.n_layers, 1 + 0 * cfg.n_layers)
