"""The layout search over many candidates at once (`cost_model.layout` for one): one
`ArchGrid` through each layout of the space, the pairs the architecture does not divide or
that do not fit masked, the best kept per candidate (`search_layout_grid`), and the same per
group of candidates sharing their categorical fields (`best_layouts`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cost_model._config import ArchConfig, ArchGrid
from cost_model._workload import Workload
from cost_model.hardware import Hardware
from cost_model.layout import (
    DEFAULT_MAX_LAYOUTS,
    DEFAULT_MAX_VIRTUAL,
    LAYOUT_METRICS,
    RECOMPUTE_CODES,
    Layout,
    LayoutSearch,
    LayoutSpace,
    PricedLayout,
    as_hardware,
    divides,
    layout_metrics,
    memory_cap,
    no_layout_reason,
    search_layout,
)
from cost_model.memory import training_memory
from cost_model.report import grid_groups
from cost_model.timing import train_step_time


@dataclass(frozen=True)
class GridLayouts:
    """Many candidates at their best layouts: `metrics[name]` (`LAYOUT_METRICS`) is a float
    array, NaN where `found` is False; `valid` marks the valid architectures, `reasons` says
    why a point has no layout (an invalid architecture, none that divides it, none that fits),
    `min_memory_bytes` the least memory among the layouts that divide it (inf: none)."""

    metrics: dict[str, np.ndarray]
    found: np.ndarray
    valid: np.ndarray
    reasons: np.ndarray
    min_memory_bytes: np.ndarray
    enumerated: int

    def __len__(self) -> int:
        return int(self.found.shape[0])


_GRID_ARRAYS = (
    "n_layers",
    "d_model",
    "n_heads",
    "kv_heads",
    "ffn_dim",
    "block_size",
    "vocab_size",
    "seq_len",
    "valid",
    "reasons",
)


def _take(grid: ArchGrid, idx: np.ndarray) -> ArchGrid:
    """The points `idx` of a grid (already validated: no checks run again)."""
    return dataclasses.replace(grid, **{name: getattr(grid, name)[idx] for name in _GRID_ARRAYS})


def search_layout_grid(
    grid: ArchGrid,
    space: LayoutSpace,
    workload: Workload | None = None,
    hardware: str | Hardware = "h100",
    memory_cap_bytes: float | None = None,
) -> GridLayouts:
    """Every candidate of `grid` at its best layout of `space`: the grid (or the points a
    layout divides) priced through each layout at once, each candidate keeping a layout when
    it fits and is faster, or as fast with less memory, than the one it holds (so the first in
    the space's order wins an exact tie, as in `search_layout`)."""
    hw = as_hardware(hardware)
    cap = memory_cap(memory_cap_bytes, hw)
    workload = workload or Workload()
    seq = workload.seq_len if workload.seq_len is not None else grid.seq_len
    layouts = space.layouts()
    n = len(grid)
    best_time = np.full(n, np.inf)
    best_memory = np.full(n, np.inf)
    best_comm = np.full(n, np.nan)
    best_index = np.full(n, -1, dtype=np.int64)
    min_memory = np.full(n, np.inf)
    divisible = np.zeros(n, dtype=np.int64)
    admitted: dict[tuple[int, int, bool], np.ndarray] = {}  # what `divides` depends on
    for index, layout in enumerate(layouts):
        key = (layout.tensor, layout.pipeline * layout.virtual, layout.sequence_parallel)
        if key not in admitted:
            mask = np.asarray(divides(grid, layout, seq), dtype=bool) & grid.valid
            admitted[key] = np.flatnonzero(mask)
        idx = admitted[key]
        if not idx.size:
            continue
        sub = grid if idx.size == n else _take(grid, idx)
        divisible[idx] += 1
        wl, par = layout.workload(workload), layout.parallelism()
        memory = np.broadcast_to(training_memory(sub, wl, par).total_bytes, idx.shape)
        min_memory[idx] = np.minimum(min_memory[idx], memory)
        fits = memory <= cap
        if not fits.any():
            continue
        if not fits.all():
            idx, memory = idx[fits], memory[fits]
            sub = _take(sub, np.flatnonzero(fits))
        step = train_step_time(sub, wl, par, hw)
        time_s = np.broadcast_to(np.asarray(step.total_s, dtype=np.float64), idx.shape)
        comm = np.broadcast_to(np.asarray(step.comm_bytes), idx.shape)
        held_t, held_m = best_time[idx], best_memory[idx]
        better = (time_s < held_t) | ((time_s == held_t) & (memory < held_m))
        win = idx[better]
        best_time[win] = time_s[better]
        best_memory[win] = memory[better]
        best_comm[win] = comm[better]
        best_index[win] = index
    found = best_index >= 0
    columns = {
        "tensor": np.array([lay.tensor for lay in layouts], dtype=np.float64),
        "pipeline": np.array([lay.pipeline for lay in layouts], dtype=np.float64),
        "virtual": np.array([lay.virtual for lay in layouts], dtype=np.float64),
        "data": np.array([lay.data for lay in layouts], dtype=np.float64),
        "micro_batch": np.array([lay.micro_batch for lay in layouts], dtype=np.float64),
        "microbatches": np.array([lay.microbatches for lay in layouts], dtype=np.float64),
        "recompute": np.array([lay.recompute_code for lay in layouts], dtype=np.float64),
        "sequence_parallel": np.array([lay.sequence_parallel for lay in layouts], np.float64),
    }
    chosen = np.where(found, best_index, 0)
    metrics: dict[str, np.ndarray] = {
        "best_step_time_s": np.where(found, best_time, np.nan),
    }
    for name, column in columns.items():
        metrics[f"best_layout_{name}"] = np.where(found, column[chosen], np.nan)
    metrics["best_layout_memory_bytes"] = np.where(found, best_memory, np.nan)
    metrics["best_layout_comm_bytes"] = np.where(found, best_comm, np.nan)
    metrics = {name: metrics[name] for name in LAYOUT_METRICS}
    reasons = grid.reasons.copy()
    for i in np.flatnonzero(~found & grid.valid):
        reasons[i] = no_layout_reason(
            len(layouts), int(divisible[i]), float(min_memory[i]), cap, space
        )
    return GridLayouts(metrics, found, grid.valid.copy(), reasons, min_memory, len(layouts))


def best_layouts(
    configs: Sequence[ArchConfig],
    space: LayoutSpace,
    workload: Workload | None = None,
    hardware: str | Hardware = "h100",
    memory_cap_bytes: float | None = None,
) -> GridLayouts:
    """Arbitrary candidates at their best layouts, in input order: candidates that share
    their categorical fields are searched together as one `ArchGrid` (`report.grid_groups`)."""
    n = len(configs)
    metrics = {name: np.full(n, np.nan) for name in LAYOUT_METRICS}
    found = np.zeros(n, dtype=bool)
    valid = np.zeros(n, dtype=bool)
    reasons = np.full(n, "", dtype=object)
    min_memory = np.full(n, np.inf)
    enumerated = 0
    for idx, first, axes in grid_groups(configs):
        grid = ArchGrid.build(first, **axes)
        part = search_layout_grid(grid, space, workload, hardware, memory_cap_bytes)
        for name, values in part.metrics.items():
            metrics[name][idx] = values
        found[idx], valid[idx], reasons[idx] = part.found, part.valid, part.reasons
        min_memory[idx] = part.min_memory_bytes
        enumerated = part.enumerated
    return GridLayouts(metrics, found, valid, reasons, min_memory, enumerated)


__all__ = [
    "DEFAULT_MAX_LAYOUTS",
    "DEFAULT_MAX_VIRTUAL",
    "LAYOUT_METRICS",
    "RECOMPUTE_CODES",
    "GridLayouts",
    "Layout",
    "LayoutSearch",
    "LayoutSpace",
    "PricedLayout",
    "best_layouts",
    "divides",
    "layout_metrics",
    "search_layout",
    "search_layout_grid",
]
