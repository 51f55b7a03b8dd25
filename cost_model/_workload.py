"""What is run on an architecture (`Workload`) and how it is split over devices (`Parallelism`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cost_model._config import CostInputError

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
