"""One call that prices a candidate with every cost term, and its vectorised twin.

`price` (one `ArchConfig`) and `price_grid` / `price_many` (many candidates as numpy arrays)
run the same formulas: `ArchGrid` carries the numeric fields as arrays and every formula is
written so that it works on both. `CostReport.metrics()` flattens a report into the named
metrics that search objectives, constraints and Pareto queries refer to (`METRICS`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model._config import ArchConfig, ArchGrid, _Derived
from cost_model._workload import Parallelism, Workload, check_positions
from cost_model.comm import (
    PipelineComm,
    data_parallel_bytes_per_step,
    pipeline_comm,
    tensor_parallel_bytes_per_step,
)
from cost_model.flops import (
    FlopsBreakdown,
    forward_flops_per_token,
    prefill_flops,
    training_flops_per_token,
)
from cost_model.hardware import Hardware, RooflineTime
from cost_model.io import ResidualIO, residual_io
from cost_model.machine import get_hardware
from cost_model.memory import InferenceMemory, TrainingMemory, inference_memory, training_memory
from cost_model.params import ParamCount, param_count
from cost_model.residuals import residual_of
from cost_model.timing import decode_token_time, train_step_time

#: Every metric a report flattens to: name → (unit, meaning). All are minimised by a search.
METRICS: dict[str, tuple[str, str]] = {
    "params": ("parameters", "exact parameter count"),
    "non_embedding_params": ("parameters", "parameters without token/position embeddings"),
    "train_flops_per_token": (
        "FLOPs",
        "model FLOPs per trained token: forward + backward, no recomputation (the budget)",
    ),
    "train_hardware_flops_per_token": (
        "FLOPs",
        "hardware FLOPs per trained token, with the workload's recomputation (the device)",
    ),
    "prefill_flops": ("FLOPs", "forward FLOPs of a prefill of prefill_tokens"),
    "decode_flops_per_token": ("FLOPs", "forward FLOPs of one decoded token at decode_context"),
    "train_memory_bytes": ("bytes", "peak training memory per device (AdamW)"),
    "activation_bytes": ("bytes", "activations saved for backward per device"),
    "depth_mixing_activation_bytes": ("bytes", "the residual wiring's saved activations"),
    "inference_memory_bytes": ("bytes", "weights + KV cache + prefill depth cache per device"),
    "kv_cache_bytes": ("bytes", "KV cache at decode_context"),
    "prefill_depth_cache_bytes": ("bytes", "depth representations held during prefill"),
    "pp_naive_bytes_per_step": ("bytes", "pipeline traffic per step, naive"),
    "pp_cached_bytes_per_step": ("bytes", "pipeline traffic per step, cross-stage caching"),
    "pp_peak_bytes_per_token": ("bytes", "largest pipeline transition per token, cached"),
    "tp_bytes_per_step": ("bytes", "tensor-parallel all-reduce bytes per step per device"),
    "dp_bytes_per_step": ("bytes", "data-parallel gradient all-reduce bytes per device"),
    "residual_io_bytes_per_token": ("bytes", "residual-path I/O per token per sublayer"),
    "step_time_s": ("seconds", "roofline time of one training step"),
    "decode_time_s": ("seconds", "roofline time of one decoding step"),
}


@dataclass(frozen=True)
class CostReport:
    """Every cost term of one candidate (or, from `price_grid`, of many: arrays)."""

    params: ParamCount
    forward_flops: FlopsBreakdown
    train_flops_per_token: Any
    train_hardware_flops_per_token: Any
    prefill_flops: Any
    decode_flops_per_token: Any
    training_memory: TrainingMemory
    inference_memory: InferenceMemory
    pipeline: PipelineComm
    tp_bytes_per_step: Any
    dp_bytes_per_step: Any
    residual_io: ResidualIO
    step_time: RooflineTime
    decode_time: RooflineTime
    hardware: str
    utilisation: dict[str, Any]  # MFU and HFU against the datasheet peak (`_utilisation`)
    device: dict[str, Any]  # the hardware: datasheet peaks beside the achievable figures

    def metrics(self) -> dict[str, Any]:
        """The flat, named metrics of `METRICS`."""
        out = {
            "params": self.params.total,
            "non_embedding_params": self.params.non_embedding,
            "train_flops_per_token": self.train_flops_per_token,
            "train_hardware_flops_per_token": self.train_hardware_flops_per_token,
            "prefill_flops": self.prefill_flops,
            "decode_flops_per_token": self.decode_flops_per_token,
            "train_memory_bytes": self.training_memory.total_bytes,
            "activation_bytes": self.training_memory.activation_bytes,
            "depth_mixing_activation_bytes": self.training_memory.depth_mixing_activation_bytes,
            "inference_memory_bytes": self.inference_memory.total_bytes,
            "kv_cache_bytes": self.inference_memory.kv_cache_bytes,
            "prefill_depth_cache_bytes": self.inference_memory.depth_cache_bytes,
            "pp_naive_bytes_per_step": self.pipeline.naive_bytes_per_step,
            "pp_cached_bytes_per_step": self.pipeline.cached_bytes_per_step,
            "pp_peak_bytes_per_token": self.pipeline.cached_peak_bytes_per_token,
            "tp_bytes_per_step": self.tp_bytes_per_step,
            "dp_bytes_per_step": self.dp_bytes_per_step,
            "residual_io_bytes_per_token": self.residual_io.bytes,
            "step_time_s": self.step_time.total_s,
            "decode_time_s": self.decode_time.total_s,
        }
        assert out.keys() == METRICS.keys()
        return out

    def as_dict(self) -> dict[str, Any]:
        """Nested sections for JSON output (scalars as Python numbers)."""
        plain: dict[str, Any] = _plain(
            {
                "params": self.params.as_dict(),
                "forward_flops_per_token": self.forward_flops.as_dict(),
                "train_flops_per_token": self.train_flops_per_token,
                "train_hardware_flops_per_token": self.train_hardware_flops_per_token,
                "prefill_flops": self.prefill_flops,
                "decode_flops_per_token": self.decode_flops_per_token,
                "training_memory": self.training_memory.as_dict(),
                "inference_memory": self.inference_memory.as_dict(),
                "pipeline": self.pipeline.as_dict(),
                "tp_bytes_per_step": self.tp_bytes_per_step,
                "dp_bytes_per_step": self.dp_bytes_per_step,
                "residual_io": {
                    "d_multiple": self.residual_io.d_multiple,
                    "scalars": self.residual_io.scalars,
                    "bytes_per_token_per_sublayer": self.residual_io.bytes,
                },
                "step_time": self.step_time.as_dict(),
                "decode_time": self.decode_time.as_dict(),
                "hardware": self.hardware,
                "device": self.device,
                "utilisation": self.utilisation,
                "metrics": self.metrics(),
            }
        )
        return plain


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _utilisation(
    cfg: _Derived,
    workload: Workload,
    parallel: Parallelism,
    hw: Hardware,
    model_per_token: Any,
    hardware_per_token: Any,
    step: RooflineTime,
) -> dict[str, Any]:
    """MFU and HFU of the priced step against the datasheet peak (not the derated one, as
    PaLM §4 and Korthikanti et al. 2022 define them): the FLOPs one device does per step,
    model FLOPs (no recomputation) or hardware FLOPs (with it), per second of the step,
    over the peak. Each data-parallel rank trains s·b·m tokens per step, its t·p devices
    sharing them."""
    s = workload.seq_len or cfg.seq_len
    tokens = s * workload.micro_batch * workload.microbatches
    per_device = tokens / (parallel.tensor * parallel.pipeline)
    peak = hw.peak(cfg.dtype)
    model_rate = model_per_token * per_device / step.total_s
    hardware_rate = hardware_per_token * per_device / step.total_s
    return {
        "model_flops_per_s_per_device": model_rate,
        "hardware_flops_per_s_per_device": hardware_rate,
        "datasheet_peak_flops": peak,
        "achievable_flops": hw.achievable(cfg.dtype),
        "mfu": model_rate / peak,
        "hfu": hardware_rate / peak,
    }


def _report(cfg: _Derived, workload: Workload, parallel: Parallelism, hw: Hardware) -> CostReport:
    s = workload.seq_len or cfg.seq_len
    check_positions(cfg, "seq_len", s)  # before the prefill and decode lengths default to it
    fwd = forward_flops_per_token(cfg, attended=s)
    hardware_per_token = training_flops_per_token(cfg, attended=s, recompute=workload.recompute)
    step = train_step_time(cfg, workload, parallel, hw)
    return CostReport(
        params=param_count(cfg),
        forward_flops=fwd,
        train_flops_per_token=3 * fwd.total_flops,
        train_hardware_flops_per_token=hardware_per_token,
        prefill_flops=prefill_flops(cfg, workload.prefill_tokens or s),
        decode_flops_per_token=forward_flops_per_token(
            cfg, attended=workload.decode_context or s
        ).total_flops,
        training_memory=training_memory(cfg, workload, parallel),
        inference_memory=inference_memory(cfg, workload, parallel),
        pipeline=pipeline_comm(cfg, parallel, workload),
        tp_bytes_per_step=tensor_parallel_bytes_per_step(cfg, parallel, workload),
        dp_bytes_per_step=data_parallel_bytes_per_step(cfg, parallel),
        residual_io=residual_io(cfg),
        step_time=step,
        decode_time=decode_token_time(cfg, workload, parallel, hw),
        hardware=hw.name,
        utilisation=_utilisation(
            cfg, workload, parallel, hw, 3 * fwd.total_flops, hardware_per_token, step
        ),
        device=hw.as_dict(cfg.dtype),
    )


def price(
    cfg: ArchConfig,
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    hardware: str | Hardware = "h100",
) -> CostReport:
    """Every cost term of one candidate."""
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    return _report(cfg, workload or Workload(), parallel or Parallelism(), hw)


@dataclass(frozen=True)
class GridPrices:
    """Metrics of many candidates: `metrics[name]` is a float array, NaN where `valid` is
    False; `reasons` says why a point is not a valid architecture."""

    metrics: dict[str, np.ndarray]
    valid: np.ndarray
    reasons: np.ndarray

    def __len__(self) -> int:
        return int(self.valid.shape[0])


def price_grid(
    base: ArchConfig,
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    hardware: str | Hardware = "h100",
    **axes: Any,
) -> GridPrices:
    """Price every point of broadcast numeric `axes` (see `ArchGrid.build`) at once."""
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    grid = ArchGrid.build(base, **axes)
    report = _report(grid, workload or Workload(), parallel or Parallelism(), hw)
    size = len(grid)
    metrics = {}
    for name, value in report.metrics().items():
        arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (size,)).copy()
        arr[~grid.valid] = np.nan
        metrics[name] = arr
    return GridPrices(metrics, grid.valid.copy(), grid.reasons.copy())


_NUMERIC = ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")


def grid_groups(
    configs: Sequence[ArchConfig],
) -> Iterator[tuple[list[int], ArchConfig, dict[str, np.ndarray]]]:
    """Arbitrary candidates as grids: per group of candidates that share their categorical
    fields (and their query/KV grouping), the members' indices in `configs`, the first member
    (the grid's base) and the numeric axes of `ArchGrid.build`."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, cfg in enumerate(configs):
        key = (
            cfg.variant,
            cfg.mlp,
            cfg.norm,
            cfg.positions,
            cfg.bias,
            cfg.tie_embeddings,
            cfg.dtype,
            cfg.streams,
            cfg.n_heads // cfg.kv_heads,
        )
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        first = configs[idx[0]]
        members = [configs[i] for i in idx]
        axes = {name: np.array([getattr(c, name) for c in members]) for name in _NUMERIC}
        axes["d_ff"] = np.array([c.ffn_dim for c in members])
        axes["n_kv_heads"] = np.array([c.kv_heads for c in members])
        if residual_of(first).has_block_size:
            axes["block_size"] = np.array([c.block_size for c in members])
        yield idx, first, axes


def price_many(
    configs: Sequence[ArchConfig],
    workload: Workload | None = None,
    parallel: Parallelism | None = None,
    hardware: str | Hardware = "h100",
) -> dict[str, np.ndarray]:
    """Metrics of arbitrary candidates, in input order: candidates that share their
    categorical fields are priced together as one `ArchGrid` (`grid_groups`)."""
    out = {name: np.full(len(configs), np.nan) for name in METRICS}
    for idx, first, axes in grid_groups(configs):
        prices = price_grid(first, workload, parallel, hardware, **axes)
        for name, values in prices.metrics.items():
            out[name][idx] = values
    return out
