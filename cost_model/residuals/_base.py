"""`Residual`: the contract every residual variant's cost terms fulfil.

A variant prices only its own wiring (sources, mixing parameters, FLOPs, saved activations,
residual I/O, pipeline payload); the Transformer terms stay in `cost_model.params`, `flops`,
`memory`, `io` and `comm`, which ask the variant for its share.

Contract of every method:
- `cfg` is an `ArchConfig` (ints) or an `ArchGrid` (int64 arrays of equal length) whose
  `variant` is this residual's name; the method reads only the fields it needs.
- Arithmetic only: no branching on numeric values, so one formula prices one candidate and a
  whole grid alike. Branching on categorical arguments (`recompute`, `schedule`) is allowed.
- A term that does not depend on the size of the model is still returned in the shape of the
  sizes (`0 * cfg.n_layers`, `1 + 0 * cfg.n_layers`), so grid results broadcast.
- Implementations are stateless and shared: one instance per variant in `RESIDUALS`.

Terminology (Attention Residuals, Kimi Team 2026): a *source* is a d-vector per token that a
sublayer's input may be built from; L = 2·L_b sublayers; N depth blocks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple, Protocol

from cost_model._variant import Variant

FP32 = 4  # bytes of the fp32 key scales, logits and weights the depth mixing keeps


class ArchSizes(Protocol):
    """What a residual reads of `cfg`: the sizes an `ArchConfig` and an `ArchGrid` both have
    (`cost_model._config._Derived`), as ints or as arrays. A protocol, so that the variants'
    implementations never import the architecture, which asks them for its `n_blocks`."""

    @property
    def variant(self) -> str: ...
    @property
    def n_layers(self) -> Any: ...
    @property
    def d_model(self) -> Any: ...
    @property
    def block_size(self) -> Any: ...
    @property
    def streams(self) -> Any: ...
    @property
    def n_sublayers(self) -> Any: ...
    @property
    def n_blocks(self) -> Any: ...


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division that works on ints and on numpy integer arrays."""
    return -(-a // b)


class SublayerIO(NamedTuple):
    """Residual-path elements per token per sublayer: `d_multiple`·d + `scalars`."""

    d_multiple: Any  # the paper's Table 1 "…·d" coefficient
    scalars: Any  # its additive scalars (mHC's coefficients)


class PipelinePayload(NamedTuple):
    """What the residual path hands from one pipeline chunk to the next, in d-vectors per
    token. `comm.pipeline_comm` turns it into traffic for a schedule (naive or cached)."""

    per_chunk: Any  # N_p: depth representations each chunk produces that later chunks read
    carried: Any  # a state handed over at every transition (the residual stream, mHC's n)


class Residual(ABC):
    """One residual variant's cost terms (see the module docstring for the contract).

    Subclass it in a module of `cost_model.residuals`, set `name` to the variant's name in
    `cost_model._config.Variant`, and register an instance in `RESIDUALS`.
    """

    name: ClassVar[Variant]
    has_block_size: ClassVar[bool] = False  # takes `ArchConfig.block_size` (S, in sublayers)
    has_streams: ClassVar[bool] = False  # takes `ArchConfig.mhc_streams` (n)
    #: The wiring has parameters of its own (`mixing_params` + `aggregation_params` > 0): the
    #: depth-mixing parameters a training run's `depth_lr_mult` scales.
    has_depth_mixing: ClassVar[bool] = True
    default_streams: ClassVar[int] = 1  # n when `mhc_streams` is None (1: one residual stream)
    max_streams: ClassVar[int] = 1

    # -- depth sources --------------------------------------------------------------------
    @abstractmethod
    def n_blocks(self, cfg: ArchSizes) -> Any:
        """N, the number of depth blocks (0 for a variant without depth attention). The
        definition: formulas read `cfg.n_blocks`, which asks it (once per `ArchGrid`)."""

    @abstractmethod
    def attended_sources_total(self, cfg: ArchSizes) -> Any:
        """Σ over sublayers of the number of sources each sublayer attends to."""

    @abstractmethod
    def aggregation_sources(self, cfg: ArchSizes) -> Any:
        """Sources of the output aggregation before the final norm (0 without one)."""

    @abstractmethod
    def live_sources(self, cfg: ArchSizes) -> Any:
        """d-vectors per token the forward pass keeps alive across depth (its working set)."""

    @abstractmethod
    def cached_sources(self, cfg: ArchSizes) -> Any:
        """Depth representations a prefill holds for every token (Attention Residuals §4)."""

    @abstractmethod
    def sources_per_stage(self, cfg: ArchSizes, stages: Any) -> Any:
        """N_p: depth representations produced per pipeline chunk when the L_b blocks are
        split evenly over `stages` chunks (a float when they do not divide)."""

    # -- costs ----------------------------------------------------------------------------
    @abstractmethod
    def mixing_params(self, cfg: ArchSizes) -> Any:
        """Parameters of the wiring inside the stack (the output aggregation excluded)."""

    @abstractmethod
    def aggregation_params(self, cfg: ArchSizes) -> Any:
        """Parameters of the output aggregation (0 without one)."""

    @abstractmethod
    def mixing_flops(self, cfg: ArchSizes) -> Any:
        """Forward FLOPs per token of the wiring (a multiply-add is 2 FLOPs)."""

    @abstractmethod
    def mixing_activation_bytes(self, cfg: ArchSizes, tokens: Any, e: int, recompute: str) -> Any:
        """Bytes the wiring saves for backward beyond a standard residual, for `tokens`
        token rows (micro-batch × sequence) with `e` bytes per activation element."""

    @abstractmethod
    def sublayer_io(self, cfg: ArchSizes, schedule: str, schedule_block: Any) -> SublayerIO:
        """Residual-path I/O per token per sublayer under `schedule` ("two_phase" or
        "naive"); `schedule_block` overrides a two-phase schedule's block (None: default)."""

    @abstractmethod
    def boundary_sources(self, cfg: ArchSizes, blocks_before: Any) -> Any:
        """d-vectors per token that cross a pipeline boundary after `blocks_before`
        Transformer blocks, counted exactly: what any later sublayer still reads."""

    @abstractmethod
    def pipeline_payload(self, cfg: ArchSizes, chunks: Any) -> PipelinePayload:
        """What crosses a pipeline transition when the L_b blocks are split over `chunks`
        chunks: depth representations (read by later chunks) and/or a carried state."""


class WithoutDepthAttention(Residual):
    """The shared terms of a variant with no attention over depth (the standard residual,
    mHC-lite, DenseFormer): no depth blocks, no attended sources, no output aggregation."""

    def n_blocks(self, cfg: ArchSizes) -> Any:
        """No depth attention: 0."""
        return 0 * cfg.n_layers

    def attended_sources_total(self, cfg: ArchSizes) -> Any:
        """No depth attention: 0."""
        return 0 * cfg.n_sublayers

    def aggregation_sources(self, cfg: ArchSizes) -> Any:
        """No output aggregation: 0."""
        return 0 * cfg.n_layers

    def aggregation_params(self, cfg: ArchSizes) -> Any:
        """No output aggregation: 0."""
        return 0 * cfg.d_model
