"""Attention Residuals (Kimi Team 2026): Full and Block AttnRes and the paper's Table 4
ablations of Full AttnRes (input-dependent query, sigmoid, no key norm).

Each sublayer's input is a softmax attention over depth sources with a learned pseudo-query
w_l ∈ R^d and RMS-normalised keys; a last pseudo-query aggregates all sources before the final
norm. Sources of the l-th sublayer (1-based, Attention Residuals §3):
- Full AttnRes: v_0 (embedding) … v_{l−1}: l sources (N = L).
- Block AttnRes, sublayer i (1-based) of block n (0-based): b_0 … b_n (the embedding and the n
  finished blocks) plus the partial b_n^{i−1} when i ≥ 2 (a zero partial is never a source).

Residual I/O conventions (as the paper's Table 1): Full AttnRes reads each source twice, once
as a key and once as a value; Block AttnRes reads it once (the two-phase kernel fuses both
uses).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from cost_model._variant import Variant
from cost_model.residuals._base import FP32, ArchSizes, PipelinePayload, Residual, SublayerIO, cdiv


def _floor_sum(length: Any, size: Any) -> Any:
    """Σ_{j=0}^{length−1} floor(j / size) in closed form: the q = ceil(length/size) − 1
    complete blocks contribute size·q(q−1)/2, the last (possibly short) one q·r."""
    q = -(-length // size) - 1
    r = length - q * size
    return size * q * (q - 1) // 2 + q * r


def default_schedule_block(cfg: ArchSizes) -> Any:
    """The two-phase schedule of Full AttnRes batches S sublayers at a time; by default the
    paper's typical N = 8 blocks: S = ceil(L / 8)."""
    return cdiv(cfg.n_sublayers, 8)


class AttnRes(Residual):
    """What Full and Block AttnRes share: N + 1 sources (the embedding and N block or sublayer
    representations), a pseudo-query and a key-norm gain per sublayer, the output
    aggregation. Subclasses say what N is and how the sources are attended."""

    def aggregation_sources(self, cfg: ArchSizes) -> Any:
        """The output aggregation attends to every source: L + 1 (Full) or N + 1 (Block)."""
        return cfg.n_blocks + 1

    def live_sources(self, cfg: ArchSizes) -> Any:
        """Full L + 1 (Attention Residuals: O(L·d)); Block N + 1 (b_0 … b_{N−1} and the
        current partial, O(N·d))."""
        return cfg.n_blocks + 1

    def cached_sources(self, cfg: ArchSizes) -> Any:
        """Full L, Block N (Attention Residuals §4: N·T·d for Block AttnRes; the embedding b_0
        is recomputed from the token ids by a lookup, so it is not counted)."""
        return cfg.n_blocks

    def sources_per_stage(self, cfg: ArchSizes, stages: Any) -> Any:
        """N / stages: each chunk produces its share of the N representations."""
        return cfg.n_blocks / stages

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """Per sublayer a pseudo-query w_l ∈ R^d and the gain of the RMSNorm on the keys:
        2·d·L (Attention Residuals §3)."""
        return 2 * cfg.d_model * cfg.n_sublayers

    def aggregation_params(self, cfg: ArchSizes) -> Any:
        """One more zero-initialised pseudo-query with its key RMSNorm gain over all sources
        before the final norm: 2·d."""
        return 2 * cfg.d_model

    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """A sublayer over k sources costs 2·k·d for the logits w_lᵀ·RMSNorm(v_i) and 2·k·d for
        the weighted sum: 4·d·Σk, with Σk = L(L+1)/2 for Full (O(L²·d)) and O(L·N) for Block,
        plus the output aggregation over its L + 1 or N + 1 sources."""
        return 4 * cfg.d_model * (self.attended_sources_total(cfg) + self.aggregation_sources(cfg))

    def mixing_activation_bytes(self, cfg: ArchSizes, tokens: Any, e: int, recompute: str) -> Any:
        """Every distinct source (L + 1: the embedding and L sublayer outputs for Full; the
        embedding and the L running block sums b_n^i for Block) is kept with its fp32 key
        scale 1/rms (the key is the source times that scale and is never stored). With static
        queries the sources that stay (Full: all L + 1; Block: the embedding and the N blocks)
        live on a depth stack that keeps one fp32 weight per (use, stack source) — the L + 1
        uses (sublayers and aggregation) times the stack's L + 1 or N + 1 sources — and
        Block's running partial, a source of one sublayer only, keeps its fp32 logit (its
        weight sits among the stack's, in the column of the block it will become). With full
        recomputation only the values (the checkpoint inputs) stay."""
        n_values = cfg.n_sublayers + 1
        if recompute == "full":
            return e * n_values * cfg.d_model * tokens
        values = e * n_values * cfg.d_model
        extras = self._key_scale_bytes(cfg) + self._weight_bytes(cfg) + self._query_bytes(cfg, e)
        return (values + extras) * tokens

    def _key_scale_bytes(self, cfg: ArchSizes) -> Any:
        """The fp32 1/rms of each of the L + 1 values."""
        return (cfg.n_sublayers + 1) * FP32

    def _weight_bytes(self, cfg: ArchSizes) -> Any:
        """The depth stack's weights, L + 1 uses × its sources, and the partials' logits."""
        return FP32 * ((cfg.n_sublayers + 1) * self.aggregation_sources(cfg) + self._partials(cfg))

    def _partials(self, cfg: ArchSizes) -> Any:
        """Uses of a running partial outside the stack (Block AttnRes only)."""
        return 0

    def _query_bytes(self, cfg: ArchSizes, e: int) -> Any:
        """What a query saves beyond its parameters (static queries: nothing)."""
        return 0

    def sublayer_io(self, cfg: ArchSizes, schedule: str, schedule_block: Any) -> SublayerIO:
        """`schedule="naive"`: every source read as key and value at every sublayer, plus
        writing the input, reading f and writing the new source: (2·Σk/L + 3)·d, with Σk
        `attended_sources_total`. Two-phase: the subclass's kernel."""
        if schedule == "naive":
            coeff = 2 * self.attended_sources_total(cfg) / cfg.n_sublayers + 3
        else:
            coeff = self._two_phase_io(cfg, schedule_block)
        return SublayerIO(coeff, 0 * cfg.d_model)

    @abstractmethod
    def _two_phase_io(self, cfg: ArchSizes, schedule_block: Any) -> Any:
        """The d-multiple of the variant's two-phase kernel."""

    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """The embedding and every sublayer output so far: 1 + 2·blocks_before (Full AttnRes
        and its ablations; Block AttnRes overrides)."""
        return 1 + 2 * blocks_before

    def pipeline_payload(self, cfg: ArchSizes, chunks: Any) -> PipelinePayload:
        """Every chunk sends its N_p depth representations on to the later chunks (naive or
        with cross-stage caching, Attention Residuals §4); no carried state."""
        return PipelinePayload(self.sources_per_stage(cfg, chunks), 0 * cfg.n_layers)


class FullAttnRes(AttnRes):
    """Full AttnRes: sublayer l attends to v_0 … v_{l−1}; N = L."""

    name: ClassVar[Variant] = "full_attnres"

    def n_blocks(self, cfg: ArchSizes) -> Any:
        """N = L: every sublayer output is a source."""
        return cfg.n_sublayers

    def attended_sources_total(self, cfg: ArchSizes) -> Any:
        """Σ_{l=1}^{L} l = L(L+1)/2, O(L²)."""
        sub = cfg.n_sublayers
        return sub * (sub + 1) // 2

    def _two_phase_io(self, cfg: ArchSizes, schedule_block: Any) -> Any:
        """Two-phase with schedule block S (N = L/S batches, `default_schedule_block` unless
        given): (S + N)·d."""
        s = default_schedule_block(cfg) if schedule_block is None else schedule_block
        return s + cdiv(cfg.n_sublayers, s)


class InputQueryAttnRes(FullAttnRes):
    """Ablation (Table 4): the query also depends on the current state, through a d×d
    projection of it."""

    name: ClassVar[Variant] = "attnres_input_query"

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """The static w_l, the key norm and a d×d projection of the current state per
        sublayer: (d² + 2d)·L (Table 4)."""
        d = cfg.d_model
        return (d * d + 2 * d) * cfg.n_sublayers

    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """Full AttnRes's, plus the query's d×d projection: 2·d² per sublayer."""
        return super().mixing_flops(cfg) + 2 * cfg.d_model * cfg.d_model * cfg.n_sublayers

    def _weight_bytes(self, cfg: ArchSizes) -> Any:
        """Per use its fp32 logits and weights: its logits exist only once its input does, so
        there is no depth stack."""
        return 2 * FP32 * (self.attended_sources_total(cfg) + self.aggregation_sources(cfg))

    def _query_bytes(self, cfg: ArchSizes, e: int) -> Any:
        """Per sublayer the normalised newest state, the projected query and the query after
        the key gain (3·e·d), plus a 1/rms."""
        return (3 * e * cfg.d_model + FP32) * cfg.n_sublayers


class SigmoidAttnRes(FullAttnRes):
    """Ablation (Table 4): a sigmoid in place of the softmax over depth. Element-wise work is
    not counted, so every cost equals Full AttnRes's."""

    name: ClassVar[Variant] = "attnres_sigmoid"


class NoKeyNormAttnRes(FullAttnRes):
    """Ablation (Table 4): the keys are the raw sources, without an RMSNorm."""

    name: ClassVar[Variant] = "attnres_no_key_norm"

    def mixing_params(self, cfg: ArchSizes) -> Any:
        """The pseudo-queries only: d·L."""
        return cfg.d_model * cfg.n_sublayers

    def aggregation_params(self, cfg: ArchSizes) -> Any:
        """The aggregation's pseudo-query only: d."""
        return cfg.d_model

    def _key_scale_bytes(self, cfg: ArchSizes) -> Any:
        """Without key norms no scales are kept."""
        return 0


class BlockAttnRes(AttnRes):
    """Block AttnRes: the L sublayers in N = ceil(L/S) blocks of S (the last one shorter when
    S does not divide L); a sublayer attends to the finished blocks and its block's partial."""

    name: ClassVar[Variant] = "block_attnres"
    has_block_size: ClassVar[bool] = True

    def n_blocks(self, cfg: ArchSizes) -> Any:
        """N = ceil(L / S)."""
        return cdiv(cfg.n_sublayers, cfg.block_size)

    def attended_sources_total(self, cfg: ArchSizes) -> Any:
        """Σ_j (1 + n_j + [i_j ≥ 2]) = L + Σ_j floor(j/S) + (L − N), O(L·N)."""
        sub = cfg.n_sublayers
        return sub + _floor_sum(sub, cfg.block_size) + (sub - cfg.n_blocks)

    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """After m = 2·blocks_before sublayers: the embedding, the floor(m/S) finished blocks
        and, when the boundary cuts a block (m mod S ≠ 0), its partial sum: a block every 12
        Transformer blocks (S = 24) cut after fewer than 12 carries 1 + 1."""
        m = 2 * blocks_before
        s = cfg.block_size
        return 1 + m // s + (m % s > 0) * 1

    def _partials(self, cfg: ArchSizes) -> Any:
        """The L − N sublayers that are not first in their block use the running partial."""
        return cfg.n_sublayers - cfg.n_blocks

    def _two_phase_io(self, cfg: ArchSizes, schedule_block: Any) -> Any:
        """Phase 1 reads the N finished blocks once for the block's S queries (N/S per
        sublayer); Phase 2 reads the Phase-1 partial result and the running partial, writes
        the input, reads f and writes the new partial: (N/S + 5)·d."""
        return cfg.n_blocks / cfg.block_size + 5
