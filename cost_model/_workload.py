"""What is run on an architecture (`Workload`) and how it is split over devices (`Parallelism`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cost_model._config import CostInputError, _Derived

T = TypeVar("T")

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")


def _positive_ints(obj: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    for name in names + optional:
        value = getattr(obj, name)
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise CostInputError(name, f"must be an integer, got {value!r}")
        if value < 1:
            raise CostInputError(name, f"must be positive, got {value}")


@dataclass(frozen=True)
class Workload:
    """Training and inference shapes the costs are computed for.

    Training: `micro_batch` sequences of `seq_len` tokens per device and micro-step,
    `microbatches` micro-steps per optimizer step (gradient accumulation, or the pipeline's
    micro-batches). Inference: a prefill of `prefill_tokens` (optionally in chunks of
    `prefill_chunk`), then decoding `decode_batch` sequences at a `decode_context`.
    """

    micro_batch: int = 8
    seq_len: int | None = None  # None: the architecture's seq_len
    microbatches: int = 1
    recompute: str = "none"
    prefill_tokens: int | None = None  # None: seq_len
    prefill_chunk: int | None = None  # None: the whole prefill at once
    decode_context: int | None = None  # None: seq_len
    decode_batch: int = 1

    def __post_init__(self) -> None:
        _positive_ints(
            self,
            ("micro_batch", "microbatches", "decode_batch"),
            ("seq_len", "prefill_tokens", "prefill_chunk", "decode_context"),
        )
        if self.recompute not in RECOMPUTE_MODES:
            raise CostInputError(
                "recompute",
                f"unknown value {self.recompute!r}; expected one of {', '.join(RECOMPUTE_MODES)}",
            )

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Parallelism:
    """Device layout: `tensor`-way tensor parallelism (Megatron-LM), optionally with sequence
    parallelism, `pipeline` physical stages with `virtual` chunks each (interleaved 1F1B),
    and `data`-way data parallelism."""

    tensor: int = 1
    pipeline: int = 1
    virtual: int = 1
    data: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        _positive_ints(self, ("tensor", "pipeline", "virtual", "data"))
        if not isinstance(self.sequence_parallel, bool):
            raise CostInputError("sequence_parallel", "must be true or false")
        if self.virtual > 1 and self.pipeline == 1:
            raise CostInputError("virtual", "virtual stages need pipeline > 1")

    @property
    def chunks(self) -> int:
        """C = P·V model chunks in pipeline order."""
        return self.pipeline * self.virtual

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data

    def in_flight_chunks(self, stage: int, microbatches: int) -> int:
        """Model chunks' activations stage `stage` (0-based) holds at its peak under 1F1B,
        each chunk being L_b/(P·V) blocks of one micro-batch.

        Non-interleaved (V = 1): the P − stage warm-up micro-batches plus the one in its
        first backward, at most the m of the step: min(m, P − stage) (Narayanan et al. 2021,
        §2.2.1; Megatron-LM's `get_forward_backward_func` warm-up). Interleaved (V > 1):
        Megatron-LM's interleaved warm-up is 2·(P − stage − 1) + (V − 1)·P chunk steps, so
        (V − 1)·P + 2·(P − stage − 1) + 1 chunks are in flight, at most V·m. On stage 0 that
        is P·V·(1 + (P − 1)/(P·V)) chunks: the "interleaved schedule memory penalty" of
        Megatron-LM's theoretical memory estimator
        (`megatron/training/theoretical_memory_usage.py`)."""
        p, v = self.pipeline, self.virtual
        if v == 1:
            return min(microbatches, p - stage)
        return min(v * microbatches, (v - 1) * p + 2 * (p - stage - 1) + 1)


def distinct_stages(pipeline: int) -> list[int]:
    """The pipeline stages whose costs can differ, in order: the first (it holds the
    embedding), the second and the last (the final norm and the head). Stages 1 to P − 2 hold
    the same blocks, parameters, FLOPs and per-micro-batch activations, and under 1F1B no
    more chunks in flight than stage 1 (`Parallelism.in_flight_chunks` does not grow with the
    stage), so stage 1 is the most loaded of them (the first on a tie): the largest over
    these stages is the largest over all P, and the same stage."""
    return sorted({0, min(1, pipeline - 1), pipeline - 1})


def check_positions(cfg: _Derived, field: str, length: Any) -> None:
    """Refuse a sequence longer than the architecture's learned position table.

    With `positions="learned"` the model has seq_len position embeddings, so a training
    sequence, a prefill or a decode context of more than seq_len tokens cannot be run; RoPE has
    no such limit. `field` names the workload field in the error."""
    if cfg.positions != "learned" or length is None:
        return
    over = np.asarray(length) > np.asarray(cfg.seq_len)
    if not np.any(over):
        return
    if np.ndim(cfg.seq_len) == 0:
        limit = f"seq_len = {cfg.seq_len}"
    else:
        limit = f"seq_len at {int(np.count_nonzero(over))} grid points"
    raise CostInputError(
        field,
        f"{length} exceeds the architecture's {limit}: learned positions cover only seq_len tokens",
    )


def most_loaded(stages: Sequence[T], score: Callable[[T], Any]) -> T:
    """The stage whose `score` is largest (the first on a tie).

    For scalar results that stage's own object; for grids (numpy arrays per field) a result of
    the same type whose every field is taken, point by point, from that point's largest stage.
    """
    if len(stages) == 1:
        return stages[0]
    scores = [np.asarray(score(s), dtype=np.float64) for s in stages]
    shape = np.broadcast_shapes(*(a.shape for a in scores))
    if shape == ():
        return stages[int(np.argmax(scores))]
    best = np.argmax(np.stack([np.broadcast_to(a, shape) for a in scores]), axis=0)
    picked: dict[str, Any] = {}
    for f in dataclasses.fields(stages[0]):  # type: ignore[arg-type]
        values = np.stack(
            [
                np.broadcast_to(np.asarray(getattr(s, f.name), dtype=np.float64), shape)
                for s in stages
            ]
        )
        picked[f.name] = np.take_along_axis(values, best[None, ...], axis=0)[0]
    return dataclasses.replace(stages[0], **picked)  # type: ignore[type-var]
