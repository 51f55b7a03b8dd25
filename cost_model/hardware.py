"""Hardware: devices in nodes joined by networks, their datasheet peaks and the fractions of
them a training step achieves; and roofline time estimates.

A `Hardware` describes one kind of device and the cluster it sits in, as a hierarchy of
networks in the manner of Calculon (Isaev et al., *Calculon: a Methodology and Tool for
High-Level Codesign of Systems and Large Language Models*, SC'23, §3: a system is a list of
networks, each with a size and a bandwidth, and each parallel dimension is placed on one):
`devices_per_node` devices share the network inside a node (`link_bandwidth`,
`link_latency_s`), nodes are joined by a slower one (`inter_node_bandwidth`,
`inter_node_latency_s`). A communication group is priced on the innermost network that holds
it (`Hardware.network_for`). Bandwidths are bytes/s per device and direction; latencies the
seconds of one message (a ring step or a pipeline send).

Peak figures are the vendors' dense (no sparsity) datasheet numbers: NVIDIA A100 datasheet
(SXM4 80GB), H100 datasheet (SXM5), H200 product brief (SXM). The presets "a100", "h100" and
"h200" are one GPU of a DGX A100, DGX H100 or DGX H200 server ("dgx-a100", "dgx-h100" and
"dgx-h200" name the same), from the NVIDIA DGX datasheets: 8 GPUs per server on NVLink and
NVSwitch (DGX A100: NVLink 3, 600 GB/s per GPU both directions, 300 GB/s each way; DGX
H100/H200: NVLink 4, 900 GB/s, 450 GB/s each way) and between servers one InfiniBand port per
GPU (DGX A100: 8× 200 Gb/s HDR, 25 GB/s per GPU each way; DGX H100/H200: 8× 400 Gb/s NDR
ConnectX-7, 50 GB/s). Latencies are approximations of one NCCL ring step (a few µs inside a
node, more across InfiniBand): the datasheets state none.

Achievable fractions (`compute_efficiency`, `memory_efficiency`, applied by default; the
datasheet peak is kept beside them and MFU/HFU are reported against it, `report`):

- compute, 0.54 of the bf16 dense peak: the mean of the fractions that make this cost model
  reproduce the measured TFLOP/s per GPU of the seven runs of Narayanan et al. 2021
  (*Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, arXiv
  2104.04473) Table 1 that are not among the tests (1.7B, 3.6B, 7.5B, 18.4B, 39.1B, 76.1B and
  529.6B parameters on 32 to 2,520 A100s, 135 to 163 TFLOP/s; each at its published tensor ×
  pipeline split with full recomputation: 0.51 to 0.61). The other runs of Tables 1 and 2
  (145.6B, 310.1B, 1008B; 174.6B) are the tests (`tests/cost_model/test_planner.py`). The
  H100 and H200 take the same fraction (an approximation: no comparable Hopper measurement
  is fitted), checked against Llama 3 405B's published throughput, held out;
- memory, 0.83 of the datasheet bandwidth: the fraction of HBM2 bandwidth measured with
  streaming kernels on a V100 (750 of 900 GB/s; Jia et al. 2018, *Dissecting the NVIDIA Volta
  GPU Architecture via Microbenchmarking*, arXiv 1804.06826), taken for HBM2e and HBM3 too
  (an approximation).

A cluster's measured steps replace both (`cost.calibration`, `cost_model.calibration`).
`Hardware.peak_only()` is the datasheet roofline (fractions 1, no latency). The "cpu"
preset's peak FLOP/s and memory bandwidth are measured on the machine (`cost_model.machine`:
a float32 matmul and a memory copy, cached; fractions 1, one network); `NOMINAL_CPU`, its
fixed figures (`DEPTHSCOPE_CPU_PEAKS=nominal`), describes a 2-core AVX2 server core pair
(2 FMA units × 8 fp32 lanes × 2 FLOPs × 3 GHz per core).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model._config import CostInputError

#: Most devices one node may hold (a bound on user input, far above any server's).
MAX_DEVICES_PER_NODE = 1 << 16


def _positive_finite(field: str, value: Any, zero_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CostInputError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise CostInputError(field, f"must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        what = "non-negative" if zero_ok else "positive"
        raise CostInputError(field, f"must be {what}, got {value!r}")


@dataclass(frozen=True)
class Network:
    """One level of the hierarchy: it joins groups of up to `size` devices (None: every
    device of the cluster) at `bandwidth` bytes/s per device and direction, `latency_s` per
    message."""

    name: str
    size: int | None
    bandwidth: float
    latency_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Hardware:
    """A device and its cluster (see the module docstring). `devices_per_node` None: one
    network joins every device (`link_bandwidth`), as a single node of any size."""

    name: str
    peak_flops: dict[str, float]  # dense FLOP/s per compute dtype (datasheet)
    memory_bandwidth: float  # bytes/s of device memory (HBM or DRAM), datasheet
    memory_bytes: float  # device memory capacity
    link_bandwidth: float  # bytes/s per direction between devices of one node (NVLink)
    devices_per_node: int | None = None
    inter_node_bandwidth: float | None = None  # bytes/s per device and direction between nodes
    link_latency_s: float = 0.0
    inter_node_latency_s: float = 0.0
    compute_efficiency: float = 1.0  # achievable fraction of the peak FLOP/s
    memory_efficiency: float = 1.0  # achievable fraction of the memory bandwidth
    efficiency_source: str = "datasheet peaks (no derating)"

    def __post_init__(self) -> None:
        for dtype, flops in self.peak_flops.items():
            _positive_finite(f"peak_flops.{dtype}", flops)
        _positive_finite("memory_bandwidth", self.memory_bandwidth)
        _positive_finite("memory_bytes", self.memory_bytes)
        _positive_finite("link_bandwidth", self.link_bandwidth)
        _positive_finite("link_latency_s", self.link_latency_s, zero_ok=True)
        _positive_finite("inter_node_latency_s", self.inter_node_latency_s, zero_ok=True)
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            _positive_finite(name, value)
            if value > 1:
                raise CostInputError(name, f"must be a fraction in (0, 1], got {value!r}")
        n = self.devices_per_node
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int):
                raise CostInputError("devices_per_node", f"must be an integer, got {n!r}")
            if not 1 <= n <= MAX_DEVICES_PER_NODE:
                raise CostInputError(
                    "devices_per_node", f"must be in [1, {MAX_DEVICES_PER_NODE}], got {n}"
                )
            if self.inter_node_bandwidth is None:
                raise CostInputError(
                    "inter_node_bandwidth", "needed with devices_per_node (the network between)"
                )
        if self.inter_node_bandwidth is not None:
            _positive_finite("inter_node_bandwidth", self.inter_node_bandwidth)

    def __hash__(self) -> int:  # the peaks are a dict: hash them as sorted pairs
        fields = dataclasses.astuple(self)
        return hash((tuple(sorted(self.peak_flops.items())), fields[0], *fields[2:]))

    def peak(self, dtype: str) -> float:
        """The datasheet peak FLOP/s for `dtype`."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise CostInputError("dtype", f"{self.name} has no peak for {dtype!r}") from None

    def achievable(self, dtype: str) -> float:
        """FLOP/s a step reaches: the peak × `compute_efficiency`."""
        return self.peak(dtype) * self.compute_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        return self.memory_bandwidth * self.memory_efficiency

    def networks(self) -> tuple[Network, ...]:
        """The hierarchy, innermost first."""
        inner = Network(
            "intra_node", self.devices_per_node, self.link_bandwidth, self.link_latency_s
        )
        if self.devices_per_node is None or self.inter_node_bandwidth is None:
            return (inner,)
        outer = Network("inter_node", None, self.inter_node_bandwidth, self.inter_node_latency_s)
        return (inner, outer)

    def network_for(self, span: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of a group of ranks that spans `span` consecutive
        ranks: inside a node when the span fits one and tiles it (ranks placed in order, node
        after node), else between nodes."""
        n = self.devices_per_node
        if n is None or self.inter_node_bandwidth is None or span <= 1:
            return self.link_bandwidth, self.link_latency_s
        if span <= n and n % span == 0:
            return self.link_bandwidth, self.link_latency_s
        return self.inter_node_bandwidth, self.inter_node_latency_s

    def check_devices(self, devices: int, field: str = "devices") -> None:
        """Refuse a device count that is neither a whole number of nodes nor a divisor of
        one node (`CostInputError` naming `field`). The pricing itself takes any count (a
        group that does not tile a node is priced between nodes); the spec, the API and the
        CLI refuse such a count as a likely mistake."""
        n = self.devices_per_node
        if n is None:
            return
        if devices % n and n % devices:
            raise CostInputError(
                field,
                f"{devices} devices are not a whole number of {self.name} nodes of {n} "
                "devices (nor a part of one that divides it)",
            )

    def peak_only(self) -> Hardware:
        """The datasheet roofline: compute and memory fractions 1 and no latency."""
        return dataclasses.replace(
            self,
            compute_efficiency=1.0,
            memory_efficiency=1.0,
            link_latency_s=0.0,
            inter_node_latency_s=0.0,
            efficiency_source="datasheet peaks (no derating)",
        )

    def replace(self, **changes: Any) -> Hardware:
        return dataclasses.replace(self, **changes)

    def as_dict(self, dtype: str | None = None) -> dict[str, Any]:
        """The description for output: the datasheet peaks beside the achievable figures."""
        out: dict[str, Any] = {
            "name": self.name,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth": self.memory_bandwidth,
            "memory_bytes": self.memory_bytes,
            "compute_efficiency": self.compute_efficiency,
            "memory_efficiency": self.memory_efficiency,
            "achievable_memory_bandwidth": self.achievable_bandwidth,
            "efficiency_source": self.efficiency_source,
            "devices_per_node": self.devices_per_node,
            "networks": [net.as_dict() for net in self.networks()],
        }
        if dtype is not None:
            out["dtype"] = dtype
            out["datasheet_peak_flops"] = self.peak(dtype)
            out["achievable_flops"] = self.achievable(dtype)
        return out


#: The CPU's nominal figures; `get_hardware("cpu")` measures the peaks instead
#: (`cost_model.machine.cpu_hardware`).
NOMINAL_CPU = Hardware(
    "cpu",
    {"bfloat16": 192e9, "float16": 192e9, "float32": 192e9},
    memory_bandwidth=20e9,
    memory_bytes=24e9,
    link_bandwidth=10e9,
)

#: Achievable fractions of the GPU presets and where they come from (module docstring).
GPU_COMPUTE_EFFICIENCY = 0.54
HBM_EFFICIENCY = 0.83
GPU_EFFICIENCY_SOURCE = (
    "compute 0.54 of peak: fitted to the measured TFLOP/s of 7 runs of Narayanan et al. 2021 "
    "(arXiv 2104.04473) Table 1 on DGX A100 (1.7B-529.6B); memory 0.83: Jia et al. 2018 "
    "(arXiv 1804.06826), 750 of 900 GB/s of HBM2 measured"
)
#: Latency of one message, seconds (approximate NCCL ring steps; the datasheets give none).
NVLINK_LATENCY_S = 3e-6
INFINIBAND_LATENCY_S = 6e-6
DGX_GPUS = 8


def _dgx(
    name: str, peaks: dict[str, float], hbm: float, memory: float, nvlink: float, ib: float
) -> Hardware:
    return Hardware(
        name,
        peaks,
        memory_bandwidth=hbm,
        memory_bytes=memory,
        link_bandwidth=nvlink,
        devices_per_node=DGX_GPUS,
        inter_node_bandwidth=ib,
        link_latency_s=NVLINK_LATENCY_S,
        inter_node_latency_s=INFINIBAND_LATENCY_S,
        compute_efficiency=GPU_COMPUTE_EFFICIENCY,
        memory_efficiency=HBM_EFFICIENCY,
        efficiency_source=GPU_EFFICIENCY_SOURCE,
    )


_HOPPER = {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}
PRESETS: dict[str, Hardware] = {
    # DGX A100: NVLink 3 600 GB/s per GPU both ways; 8× 200 Gb/s HDR InfiniBand (25 GB/s each)
    "a100": _dgx(
        "a100",
        {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
        2.039e12,
        80e9,
        300e9,
        25e9,
    ),
    # DGX H100: NVLink 4 900 GB/s per GPU both ways; 8× 400 Gb/s NDR ConnectX-7 (50 GB/s each)
    "h100": _dgx("h100", dict(_HOPPER), 3.35e12, 80e9, 450e9, 50e9),
    # DGX H200: the H100's networks; 141 GB of HBM3e at 4.8 TB/s
    "h200": _dgx("h200", dict(_HOPPER), 4.8e12, 141e9, 450e9, 50e9),
    "cpu": NOMINAL_CPU,
}
#: Other names of the presets.
ALIASES: dict[str, str] = {"dgx-a100": "a100", "dgx-h100": "h100", "dgx-h200": "h200"}


@dataclass(frozen=True)
class RooflineTime:
    """Seconds: compute-bound and memory-bound times, communication, the pipeline bubble, and
    the estimate total = max(compute, memory) + communication + bubble (no overlap assumed).
    `comm_bytes`: the bytes per device the communication time sends."""

    compute_s: Any
    memory_s: Any
    comm_s: Any
    bubble_s: Any
    comm_bytes: Any = 0

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
            "comm_bytes": self.comm_bytes,
        }


def roofline(
    flops: Any,
    bytes_moved: Any,
    hw: Hardware,
    dtype: str,
    comm_bytes: Any = 0,
    bubble_fraction: float = 0.0,
    comm_s: Any = None,
) -> RooflineTime:
    """Williams et al. 2009 roofline: busy time = max(FLOPs / achievable FLOP/s, bytes /
    achievable bandwidth) (FLOPs, bytes, FLOP/s and bytes/s in, seconds out); plus the
    communication time `comm_s` (default: comm_bytes over the network inside a node) and the
    pipeline bubble, `bubble_fraction` × the busy time (the bubble is idle time in proportion
    to the ideal step time, Narayanan et al. 2021 §2.2: compute- or memory-bound alike)."""
    compute = flops / hw.achievable(dtype)
    memory = bytes_moved / hw.achievable_bandwidth
    return RooflineTime(
        compute_s=compute,
        memory_s=memory,
        comm_s=comm_bytes / hw.link_bandwidth if comm_s is None else comm_s,
        bubble_s=bubble_fraction * np.maximum(compute, memory),
        comm_bytes=comm_bytes,
    )
