"""DenseFormer (Pagliardini et al. 2024, arXiv 2402.02622): after each block a depth-weighted
average (DWA) of the embedding and every block output so far."""

from __future__ import annotations

from typing import Any, ClassVar

from cost_model._variant import Variant
from cost_model.residuals._base import ArchSizes, PipelinePayload, SublayerIO, WithoutDepthAttention


class DenseFormer(WithoutDepthAttention):
    """DenseFormer: the sources are the embedding and the L_b block outputs."""

    name: ClassVar[Variant] = "denseformer"

    def live_sources(self, cfg: ArchSizes) -> Any:
        """L_b + 1: the embedding and every block output."""
        return cfg.n_layers + 1

    def cached_sources(self, cfg: ArchSizes) -> Any:
        """L_b: the block outputs (the embedding is recomputed by a lookup)."""
        return cfg.n_layers

    def sources_per_stage(self, cfg: ArchSizes, stages: Any) -> Any:
        """L_b / stages block outputs per chunk."""
        return cfg.n_layers / stages

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """After block i (1-based) one weight per source, i + 1 (embedding and i block
        outputs): Σ_{i=1}^{L_b} (i+1) = L_b·(L_b+3)/2."""
        return cfg.n_layers * (cfg.n_layers + 3) // 2

    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """After block i, a weighted sum over i + 1 sources: Σ 2(i+1)·d = d·L_b(L_b+3)."""
        return cfg.d_model * cfg.n_layers * (cfg.n_layers + 3)

    def mixing_activation_bytes(self, cfg: ArchSizes, tokens: Any, e: int, recompute: str) -> Any:
        """Every block output before its weighted average (e·d per block)."""
        return e * cfg.d_model * cfg.n_layers * tokens

    def sublayer_io(self, cfg: ArchSizes, schedule: str, schedule_block: Any) -> SublayerIO:
        """The standard 3d, plus after each block a weighted average reading its i + 1
        sources and writing one, amortised over the block's two sublayers:
        3d + (L_b + 5)/4·d (any schedule)."""
        return SublayerIO(3 + (cfg.n_layers + 5) / 4, 0 * cfg.d_model)

    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """The embedding and every block output so far: 1 + blocks_before."""
        return 1 + blocks_before

    def pipeline_payload(self, cfg: ArchSizes, chunks: Any) -> PipelinePayload:
        """Its block outputs, like AttnRes's depth representations (naive or cached)."""
        return PipelinePayload(self.sources_per_stage(cfg, chunks), 0 * cfg.n_layers)
