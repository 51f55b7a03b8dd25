"""The fastest parallel layout of a candidate on a given number of devices: an execution
search in the manner of Calculon (Isaev et al. 2023, *Calculon: a Methodology and Tool for
High-Level Codesign of Systems and Large Language Models*, SC'23, §4: enumerate every
tensor × pipeline × data split, interleaving, micro-batch size, recomputation and sequence
parallelism, price each, keep the fastest that fits in memory).

A layout is (tensor t, pipeline p, virtual v, data d, micro-batch b, recompute r, sequence
parallelism). The global batch of B sequences is split as B = d · b · m (m micro-batches per
step and data-parallel rank) and the devices as D = t · p · d exactly. The space
(`LayoutSpace`) holds the layouts that do not depend on the architecture:

- D = t · p · d and B % (d · b) = 0;
- v > 1 only with p > 1, and then m % p = 0: the interleaved 1F1B schedule needs the number
  of micro-batches to be a multiple of the pipeline depth (Narayanan et al. 2021, *Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, §2.2.2; Megatron-LM
  refuses any other count in its interleaved schedule). Plain 1F1B (v = 1) runs any m, its
  bubble (p − 1)/m included;
- sequence parallelism only with t > 1 (Korthikanti et al. 2022, §4.2.2: it splits the
  tensor-parallel region's replicated activations over the t ranks).

An architecture then admits a layout (`divides`) when Megatron-LM's tensor and pipeline
splits exist for it (Shoeybi et al. 2019, §3; Narayanan et al. 2021, §2.2):

- n_heads % t = 0 and n_kv_heads % t = 0 (whole heads, whole K/V groups per rank), and
  d_ff % t = 0 (the column-parallel MLP splits its hidden width evenly);
- n_layers % (p · v) = 0: `n_layers` counts Transformer blocks L_b, and each of the p · v
  model chunks holds L_b/(p · v) whole blocks (both sublayers of a block stay together).
  A Block AttnRes depth block (S sublayers) may straddle a chunk boundary; the pipeline
  payload (`comm.pipeline_comm`) counts N/(p · v) representations per chunk either way;
- with sequence parallelism, seq_len % t = 0 (the sequence is split over the t ranks).

The vocabulary needs no divisibility: Megatron-LM pads the embedding to a multiple of t.

Each admitted layout is priced with the cost model's own formulas, through their current
signatures: memory per device `memory.training_memory(...).total_bytes`, the roofline step
time `timing.train_step_time(...).total_s` for the whole global batch, and the bytes that
step sends over the networks, `comm_bytes` (tensor-parallel all-reduces, pipeline traffic
with cross-stage caching, the data-parallel gradient all-reduce, as `timing` counts and
places them: each group on the network it spans, inside a node or between nodes). The best
layout is the fastest whose memory is at most the cap; among equal times the
one with less memory, then the first in the space's order (t, p, v, d, b ascending; recompute
none, selective, full; without sequence parallelism first).

`search_layout` prices one candidate (a loop over the layouts, which also returns the
feasible list); `cost_model.layout_grid` prices many at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cost_model._config import ArchConfig, CostInputError, _Derived
from cost_model._workload import RECOMPUTE_MODES, Parallelism, Workload
from cost_model.hardware import Hardware
from cost_model.machine import get_hardware
from cost_model.memory import training_memory
from cost_model.timing import train_step_time

#: `best_layout_recompute`'s number for each recomputation mode: none 0, selective 1, full 2.
RECOMPUTE_CODES: dict[str, int] = {mode: i for i, mode in enumerate(RECOMPUTE_MODES)}

#: The metrics of a candidate at its best layout: name → (unit, meaning). All are numbers, so
#: that a search may minimise them or cap them like `report.METRICS`.
LAYOUT_METRICS: dict[str, tuple[str, str]] = {
    "best_step_time_s": ("seconds", "roofline step time of the global batch, best layout"),
    "best_layout_tensor": ("ranks", "tensor-parallel ranks of the best layout"),
    "best_layout_pipeline": ("ranks", "pipeline stages of the best layout"),
    "best_layout_virtual": ("chunks", "virtual stages per pipeline rank of the best layout"),
    "best_layout_data": ("ranks", "data-parallel ranks of the best layout"),
    "best_layout_micro_batch": ("sequences", "micro-batch of the best layout"),
    "best_layout_microbatches": ("micro-batches", "micro-batches per step of the best layout"),
    "best_layout_recompute": (
        "code",
        "recomputation of the best layout: 0 none, 1 selective, 2 full",
    ),
    "best_layout_sequence_parallel": ("flag", "1 with sequence parallelism, else 0"),
    "best_layout_memory_bytes": ("bytes", "peak training memory per device, best layout"),
    "best_layout_comm_bytes": ("bytes", "bytes per device and step over the links, best layout"),
}

#: Layouts a space may hold by default (`LayoutSpace.max_layouts`); callers serving strangers
#: set their own, lower.
DEFAULT_MAX_LAYOUTS = 100_000
#: Virtual stages per pipeline rank tried by default (`LayoutSpace.max_virtual`).
DEFAULT_MAX_VIRTUAL = 8


@dataclass(frozen=True)
class Layout:
    """One way to run a training step on t · p · d devices."""

    tensor: int
    pipeline: int
    virtual: int
    data: int
    micro_batch: int  # b sequences per micro-batch and data-parallel rank
    microbatches: int  # m = B / (d · b)
    recompute: str
    sequence_parallel: bool

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def recompute_code(self) -> int:
        return RECOMPUTE_CODES[self.recompute]

    def parallelism(self) -> Parallelism:
        return Parallelism(
            tensor=self.tensor,
            pipeline=self.pipeline,
            virtual=self.virtual,
            data=self.data,
            sequence_parallel=self.sequence_parallel,
        )

    def workload(self, base: Workload | None = None) -> Workload:
        """`base` (its sequence length and inference shapes) with this layout's micro-batch,
        micro-batches and recomputation."""
        return (base or Workload()).replace(
            micro_batch=self.micro_batch, microbatches=self.microbatches, recompute=self.recompute
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order (trial division up to √n)."""
    small, large = [], []
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return small + large[::-1]


def _check_int(field: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CostInputError(field, f"must be an integer, got {value!r}")
    if value < low:
        raise CostInputError(field, f"must be at least {low}, got {value}")


@dataclass(frozen=True)
class LayoutSpace:
    """The layouts of `devices` devices for a global batch of `global_batch` sequences that
    do not depend on the architecture (the module docstring's first list), with v up to
    `max_virtual`, the recomputation modes `recompute` and the sequence-parallel settings
    `sequence_parallel`. Holding more than `max_layouts` layouts is refused (`CostInputError`
    on `devices`) before they are all built."""

    devices: int
    global_batch: int
    max_virtual: int = DEFAULT_MAX_VIRTUAL
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    sequence_parallel: tuple[bool, ...] = (False, True)
    max_layouts: int = DEFAULT_MAX_LAYOUTS

    def __post_init__(self) -> None:
        for name in ("devices", "global_batch", "max_virtual", "max_layouts"):
            _check_int(name, getattr(self, name))
        modes = tuple(self.recompute)
        if (
            not modes
            or any(m not in RECOMPUTE_MODES for m in modes)
            or len(set(modes)) < len(modes)
        ):
            raise CostInputError(
                "recompute",
                f"must be distinct values of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}",
            )
        flags = tuple(self.sequence_parallel)
        if not flags or any(not isinstance(f, bool) for f in flags) or len(set(flags)) < len(flags):
            raise CostInputError(
                "sequence_parallel", f"must be distinct true/false values, got {flags!r}"
            )
        object.__setattr__(self, "recompute", modes)
        object.__setattr__(self, "sequence_parallel", flags)

    def _generate(self) -> Iterator[Layout]:
        """Every layout, in the space's order (see the module docstring)."""
        big_b = self.global_batch
        for t in _divisors(self.devices):
            for p in _divisors(self.devices // t):
                d = self.devices // (t * p)
                if big_b % d:
                    continue
                for v in range(1, (self.max_virtual if p > 1 else 1) + 1):
                    for b in _divisors(big_b // d):
                        m = big_b // (d * b)
                        if v > 1 and m % p:
                            continue  # interleaved 1F1B: m a multiple of p
                        for r in self.recompute:
                            for sp in self.sequence_parallel:
                                if sp and t == 1:
                                    continue
                                yield Layout(t, p, v, d, b, m, r, sp)

    def layouts(self) -> tuple[Layout, ...]:
        """The layouts, built at most `max_layouts` + 1 at a time before a refusal."""
        out: list[Layout] = []
        for layout in self._generate():
            out.append(layout)
            if len(out) > self.max_layouts:
                raise CostInputError(
                    "devices",
                    f"{self.devices} devices and a global batch of {self.global_batch} "
                    f"sequences (virtual stages up to {self.max_virtual}) give more than "
                    f"{self.max_layouts} layouts to search; lower devices, global_batch or "
                    "max_virtual",
                )
        return tuple(out)  # never empty: t = d = 1, p = devices is always one


def divides(cfg: _Derived, layout: Layout, seq_len: Any = None) -> Any:
    """Whether the architecture admits the layout (the module docstring's second list): a
    bool for an `ArchConfig`, a bool array for an `ArchGrid`. `seq_len`: the workload's
    sequence length (None: the architecture's)."""
    t, chunks = layout.tensor, layout.pipeline * layout.virtual
    s = cfg.seq_len if seq_len is None else seq_len
    ok = (cfg.n_heads % t == 0) & (cfg.kv_heads % t == 0) & (cfg.ffn_dim % t == 0)
    ok = ok & (cfg.n_layers % chunks == 0)
    if layout.sequence_parallel:
        ok = ok & (s % t == 0)
    return ok


@dataclass(frozen=True)
class PricedLayout:
    """A layout with its step time (seconds), memory per device (bytes) and the bytes per
    device and step sent over the links."""

    layout: Layout
    step_time_s: float
    memory_bytes: float
    comm_bytes: float

    def as_dict(self) -> dict[str, Any]:
        return self.layout.as_dict() | {
            "step_time_s": self.step_time_s,
            "memory_bytes": self.memory_bytes,
            "comm_bytes": self.comm_bytes,
        }


def layout_metrics(best: PricedLayout) -> dict[str, float]:
    """The flat `LAYOUT_METRICS` of a best layout."""
    lay = best.layout
    out = {
        "best_step_time_s": best.step_time_s,
        "best_layout_tensor": float(lay.tensor),
        "best_layout_pipeline": float(lay.pipeline),
        "best_layout_virtual": float(lay.virtual),
        "best_layout_data": float(lay.data),
        "best_layout_micro_batch": float(lay.micro_batch),
        "best_layout_microbatches": float(lay.microbatches),
        "best_layout_recompute": float(lay.recompute_code),
        "best_layout_sequence_parallel": float(lay.sequence_parallel),
        "best_layout_memory_bytes": best.memory_bytes,
        "best_layout_comm_bytes": best.comm_bytes,
    }
    assert out.keys() == LAYOUT_METRICS.keys()
    return out


def no_layout_reason(
    enumerated: int, divisible: int, min_memory: float, cap: float, space: LayoutSpace
) -> str:
    if divisible == 0:
        return (
            f"none of the {enumerated} layouts of {space.devices} devices and a global batch "
            f"of {space.global_batch} divides the architecture (n_heads, n_kv_heads and d_ff "
            "by tensor; n_layers by pipeline × virtual; seq_len by tensor with sequence "
            "parallelism)"
        )
    return (
        f"no layout fits the memory cap: the smallest of the {divisible} layouts that divide "
        f"the architecture needs {min_memory:.4g} bytes per device, over the cap of "
        f"{cap:.4g} bytes"
    )


@dataclass(frozen=True)
class LayoutSearch:
    """One candidate's search: the best layout (None when none is feasible, `reason` says
    why), the feasible layouts fastest first (at most the `keep` asked for; `feasible_count`
    counts them all), how many layouts the space held and how many the architecture
    divides, the least memory among those, and the cap (bytes)."""

    best: PricedLayout | None
    feasible: tuple[PricedLayout, ...]
    feasible_count: int
    enumerated: int
    divisible: int
    min_memory_bytes: float  # inf when no layout divides the architecture
    memory_cap_bytes: float
    reason: str

    def metrics(self) -> dict[str, float]:
        """`LAYOUT_METRICS` of the best layout (CostInputError when there is none)."""
        if self.best is None:
            raise CostInputError("layout", self.reason)
        return layout_metrics(self.best)

    def as_dict(self) -> dict[str, Any]:
        return {
            "best": None if self.best is None else self.best.as_dict(),
            "feasible_count": self.feasible_count,
            "enumerated": self.enumerated,
            "divisible": self.divisible,
            "min_memory_bytes": None
            if math.isinf(self.min_memory_bytes)
            else self.min_memory_bytes,
            "memory_cap_bytes": self.memory_cap_bytes,
            "reason": self.reason,
            "feasible": [p.as_dict() for p in self.feasible],
        }


def as_hardware(hardware: str | Hardware) -> Hardware:
    return get_hardware(hardware) if isinstance(hardware, str) else hardware


def memory_cap(memory_cap_bytes: float | None, hw: Hardware) -> float:
    """The cap in bytes: the one given (inf: no cap), else the preset's device memory."""
    if memory_cap_bytes is None:
        return float(hw.memory_bytes)
    if isinstance(memory_cap_bytes, bool) or not isinstance(memory_cap_bytes, int | float):
        raise CostInputError("memory_cap_bytes", f"must be a number, got {memory_cap_bytes!r}")
    if math.isnan(memory_cap_bytes) or memory_cap_bytes <= 0:
        raise CostInputError(
            "memory_cap_bytes", f"must be a positive number of bytes, got {memory_cap_bytes!r}"
        )
    return float(memory_cap_bytes)


def _price(cfg: _Derived, layout: Layout, workload: Workload, hw: Hardware) -> tuple[Any, Any, Any]:
    """(step time s, memory bytes per device, link bytes per device and step) of a layout."""
    wl, par = layout.workload(workload), layout.parallelism()
    memory = training_memory(cfg, wl, par).total_bytes
    step = train_step_time(cfg, wl, par, hw)
    return step.total_s, memory, step.comm_bytes


def search_layout(
    cfg: ArchConfig,
    space: LayoutSpace,
    workload: Workload | None = None,
    hardware: str | Hardware = "h100",
    memory_cap_bytes: float | None = None,
    keep: int = 0,
) -> LayoutSearch:
    """Price every layout of `space` that `cfg` divides, one at a time, and keep the fastest
    that fits under `memory_cap_bytes` (None: the preset's device memory), and the `keep`
    fastest feasible ones in order. `workload` gives the sequence length (and nothing else
    the search decides)."""
    _check_int("keep", keep, low=0)
    hw = as_hardware(hardware)
    cap = memory_cap(memory_cap_bytes, hw)
    workload = workload or Workload()
    seq = workload.seq_len or cfg.seq_len
    layouts = space.layouts()
    feasible: list[tuple[float, float, int, PricedLayout]] = []
    divisible, min_memory = 0, math.inf
    for index, layout in enumerate(layouts):
        if not divides(cfg, layout, seq):
            continue
        divisible += 1
        time_s, memory, comm = (float(x) for x in _price(cfg, layout, workload, hw))
        min_memory = min(min_memory, memory)
        if memory <= cap:
            priced = PricedLayout(layout, time_s, memory, comm)
            feasible.append((time_s, memory, index, priced))
    feasible.sort(key=lambda row: row[:3])
    best = feasible[0][3] if feasible else None
    reason = "" if best else no_layout_reason(len(layouts), divisible, min_memory, cap, space)
    return LayoutSearch(
        best=best,
        feasible=tuple(row[3] for row in feasible[:keep]),
        feasible_count=len(feasible),
        enumerated=len(layouts),
        divisible=divisible,
        min_memory_bytes=min_memory,
        memory_cap_bytes=cap,
        reason=reason,
    )
