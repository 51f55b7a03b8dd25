"""The standard residual h_{l+1} = h_l + f_l(h_l): one stream, no parameters of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from cost_model.residuals._base import PipelinePayload, SublayerIO, WithoutDepthAttention

if TYPE_CHECKING:
    from cost_model._config import Variant, _Derived


class Baseline(WithoutDepthAttention):
    """The standard (PreNorm) residual: the reference every other variant's costs add to."""

    name: ClassVar[Variant] = "baseline"
    has_depth_mixing: ClassVar[bool] = False  # no parameters in the wiring

    def live_sources(self, cfg: _Derived) -> Any:
        """1: the residual stream."""
        return 1 + 0 * cfg.n_layers

    def cached_sources(self, cfg: _Derived) -> Any:
        """1: the residual stream."""
        return 1 + 0 * cfg.n_layers

    def sources_per_stage(self, cfg: _Derived, stages: Any) -> Any:
        """No depth representations: 0."""
        return 0 * cfg.n_layers

    def mixing_params(self, cfg: _Derived) -> Any:
        """None."""
        return 0 * cfg.d_model

    def mixing_flops(self, cfg: _Derived) -> Any:
        """The residual add is element-wise, not counted: 0."""
        return 0 * cfg.d_model

    def mixing_activation_bytes(self, cfg: _Derived, tokens: Any, e: int, recompute: str) -> Any:
        """Nothing beyond a standard residual: 0."""
        return 0 * cfg.d_model

    def sublayer_io(self, cfg: _Derived, schedule: str, schedule_block: Any) -> SublayerIO:
        """Read h and f(h), write h: 3d (any schedule)."""
        zero = 0 * cfg.d_model
        return SublayerIO(3 + zero, zero)

    def boundary_sources(self, cfg: _Derived, blocks_before: Any) -> Any:
        """The hidden state: 1."""
        return 1 + 0 * blocks_before

    def pipeline_payload(self, cfg: _Derived, chunks: Any) -> PipelinePayload:
        """One hidden state per transition; caching changes nothing."""
        return PipelinePayload(0 * cfg.n_layers, 1 + 0 * cfg.n_layers)
