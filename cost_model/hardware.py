"""Hardware presets and roofline time estimates.

Peak figures are the vendors' dense (no sparsity) numbers: NVIDIA A100 datasheet (SXM4 80GB),
H100 datasheet (SXM5), H200 product brief (SXM). The "cpu" preset's peak FLOP/s and memory
bandwidth are measured on the machine (`cost_model.machine`: a float32 matmul and a memory
copy, cached); `NOMINAL_CPU`, its fixed figures (`DEPTHSCOPE_CPU_PEAKS=nominal`), describes a
2-core AVX2 server core pair (2 FMA units × 8 fp32 lanes × 2 FLOPs × 3 GHz per core).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model._config import CostInputError


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: dict[str, float]  # dense FLOP/s per compute dtype
    memory_bandwidth: float  # bytes/s of device memory (HBM or DRAM)
    memory_bytes: float  # device memory capacity
    link_bandwidth: float  # bytes/s per direction between devices (NVLink, or network)

    def peak(self, dtype: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise CostInputError("dtype", f"{self.name} has no peak for {dtype!r}") from None


#: The CPU's nominal figures; `get_hardware("cpu")` measures the peaks instead
#: (`cost_model.machine.cpu_hardware`).
NOMINAL_CPU = Hardware(
    "cpu",
    {"bfloat16": 192e9, "float16": 192e9, "float32": 192e9},
    memory_bandwidth=20e9,
    memory_bytes=24e9,
    link_bandwidth=10e9,
)

PRESETS: dict[str, Hardware] = {
    "a100": Hardware(
        "a100",
        {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
        memory_bandwidth=2.039e12,
        memory_bytes=80e9,
        link_bandwidth=300e9,  # NVLink 3: 600 GB/s both directions
    ),
    "h100": Hardware(
        "h100",
        {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
        memory_bandwidth=3.35e12,
        memory_bytes=80e9,
        link_bandwidth=450e9,  # NVLink 4: 900 GB/s both directions
    ),
    "h200": Hardware(
        "h200",
        {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
        memory_bandwidth=4.8e12,
        memory_bytes=141e9,
        link_bandwidth=450e9,
    ),
    "cpu": NOMINAL_CPU,
}


def get_hardware(name: str) -> Hardware:
    """The preset `name`; "cpu" with this machine's measured peaks (`cost_model.machine`)."""
    if name.lower() == "cpu":
        from cost_model.machine import cpu_hardware  # it imports this module

        return cpu_hardware()
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise CostInputError(
            "hardware", f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}"
        ) from None


@dataclass(frozen=True)
class RooflineTime:
    """Seconds: compute-bound and memory-bound times, communication, the pipeline bubble, and
    the estimate total = max(compute, memory) + communication + bubble (no overlap assumed).
    """

    compute_s: Any
    memory_s: Any
    comm_s: Any
    bubble_s: Any

    @property
    def total_s(self) -> Any:
        return np.maximum(self.compute_s, self.memory_s) + self.comm_s + self.bubble_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "comm_s": self.comm_s,
            "bubble_s": self.bubble_s,
            "total_s": self.total_s,
        }


def roofline(
    flops: Any,
    bytes_moved: Any,
    hw: Hardware,
    dtype: str,
    comm_bytes: Any = 0,
    bubble_fraction: float = 0.0,
) -> RooflineTime:
    """Williams et al. 2009 roofline: busy time = max(FLOPs / peak, bytes / bandwidth) (FLOPs,
    bytes, FLOP/s and bytes/s in, seconds out); plus link time comm_bytes / link bandwidth and
    the pipeline bubble, `bubble_fraction` × the busy time (the bubble is idle time in
    proportion to the ideal step time, Narayanan et al. 2021 §2.2: compute- or memory-bound
    alike)."""
    compute = flops / hw.peak(dtype)
    memory = bytes_moved / hw.memory_bandwidth
    return RooflineTime(
        compute_s=compute,
        memory_s=memory,
        comm_s=comm_bytes / hw.link_bandwidth,
        bubble_s=bubble_fraction * np.maximum(compute, memory),
    )
