"""The CPU's peak figures, measured on this machine: the "cpu" hardware preset's.

- Matmul: the best of a few float32 products of two n×n matrices (numpy, hence the BLAS numpy
  is built with, on every core it uses), 2·n³ FLOPs each (one multiply and one add per term).
- Memory bandwidth: the best of a few copies of a float32 array far larger than the caches,
  counted as in McCalpin's STREAM benchmark ("Memory Bandwidth and Machine Balance in Current
  High Performance Computers", 1995): 2 × the array's bytes per copy (one read, one write;
  the write-allocate read is not counted).

Both run well under a second together (`MEASURE_BUDGET_S`). The figures are cached in the
process (`cpu_peaks` is memoised) and on disk, in `$XDG_CACHE_HOME/depthscope/cpu_peaks.json`
(default `~/.cache`), keyed by this machine (host name, CPU model, CPUs this process may run
on), so a later process, the HTTP service included (it has no torch), reads them instead of
measuring. The environment variable `DEPTHSCOPE_CPU_PEAKS` chooses: `measure` (the default),
or `nominal` for the preset's fixed figures of `cost_model.hardware` (reproducible across
machines). The half-precision peaks are taken equal to float32's: numpy has no bfloat16
matrix product to measure, and the trainer runs float32 on the CPU.

Standard library and numpy only.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from cost_model._config import CostInputError
from cost_model.hardware import ALIASES, NOMINAL_CPU, PRESETS, Hardware

log = logging.getLogger(__name__)

#: The environment variable that chooses measured or nominal CPU peaks.
PEAKS_ENV = "DEPTHSCOPE_CPU_PEAKS"
PEAKS_MODES = ("measure", "nominal")
#: The matrices' side (float32: 4 MiB each, 2.1 GFLOP a product).
MATMUL_N = 1024
#: The copied array (float32 elements: 64 MiB, two arrays, beyond most last-level caches).
COPY_ELEMENTS = 16 * 2**20
#: Seconds each measurement may take (it stops after `REPEATS` runs or this long).
MEASURE_BUDGET_S = 0.25
REPEATS = 8
#: The cache file's format version (a file of another is measured again).
CACHE_VERSION = 1


@dataclass(frozen=True)
class CpuPeaks:
    """Measured peaks of this machine's CPU."""

    flops_per_s: float  # float32 matmul FLOP/s, best of the runs
    bandwidth_bytes_per_s: float  # memory copy bytes/s (read + write), best of the runs
    matmul_n: int
    copy_bytes: int  # bytes of one array copied
    source: str  # measured | cache | nominal
    machine: str  # the cache key


def machine_key() -> str:
    """This machine as the cache knows it: host name, CPU model and the CPUs this process
    may run on (a BLAS uses all of them)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return f"{platform.node()}|{model}|{cpus} cpus"


def _best_rate(work: float, run: object, budget_s: float, repeats: int) -> float:
    """work / the fastest of up to `repeats` timed calls of `run` (within `budget_s` after the
    first, which also warms up)."""
    assert callable(run)
    best = float("inf")
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        if i >= 1 and time.perf_counter() - start > budget_s:
            break
    return work / best


def measure_cpu_peaks(
    matmul_n: int = MATMUL_N,
    copy_elements: int = COPY_ELEMENTS,
    budget_s: float = MEASURE_BUDGET_S,
    repeats: int = REPEATS,
) -> CpuPeaks:
    """Measure now (no cache): the float32 matmul FLOP/s (2·n³ per product) and the copy
    bandwidth (2 × bytes per copy), each the best of up to `repeats` runs within `budget_s`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    y = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    out = np.empty_like(x)
    flops = _best_rate(2.0 * matmul_n**3, lambda: np.matmul(x, y, out=out), budget_s, repeats)
    src = np.ones(copy_elements, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the destination's pages in before timing
    bandwidth = _best_rate(2.0 * src.nbytes, lambda: np.copyto(dst, src), budget_s, repeats)
    return CpuPeaks(flops, bandwidth, matmul_n, int(src.nbytes), "measured", machine_key())


def cache_path() -> Path:
    """`$XDG_CACHE_HOME/depthscope/cpu_peaks.json` (XDG_CACHE_HOME defaults to ~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "depthscope" / "cpu_peaks.json"


def _read_cache(path: Path, key: str) -> CpuPeaks | None:
    try:
        data = json.loads(path.read_text())
        entry = data["machines"][key] if data.get("version") == CACHE_VERSION else None
        if entry is None:
            return None
        peaks = CpuPeaks(**entry)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or of another form: measure again
    if not (peaks.flops_per_s > 0 and peaks.bandwidth_bytes_per_s > 0):
        return None
    return replace(peaks, source="cache")


def _write_cache(path: Path, peaks: CpuPeaks) -> None:
    """Add this machine's entry (atomically: a temporary file, then a rename); a cache that
    cannot be written is only logged."""
    try:
        try:
            data = json.loads(path.read_text())
            machines = data["machines"] if data.get("version") == CACHE_VERSION else {}
            if not isinstance(machines, dict):
                machines = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            machines = {}
        machines[peaks.machine] = asdict(peaks)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu_peaks.")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": CACHE_VERSION, "machines": machines}, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write the CPU peaks cache %s: %s", path, exc)


def peaks_mode() -> str:
    """`DEPTHSCOPE_CPU_PEAKS` checked: measure (default) or nominal."""
    mode = os.environ.get(PEAKS_ENV, "measure").strip().lower() or "measure"
    if mode not in PEAKS_MODES:
        raise CostInputError(
            PEAKS_ENV, f"unknown value {mode!r}; expected {' or '.join(PEAKS_MODES)}"
        )
    return mode


@functools.cache
def cpu_peaks() -> CpuPeaks:
    """This machine's peaks, once per process: from the disk cache when it has this
    machine, else measured (and written there). Under `DEPTHSCOPE_CPU_PEAKS=nominal`, the
    nominal figures of `cost_model.hardware.NOMINAL_CPU`."""
    if peaks_mode() == "nominal":
        return CpuPeaks(
            NOMINAL_CPU.peak("float32"),
            NOMINAL_CPU.memory_bandwidth,
            0,
            0,
            "nominal",
            "nominal",
        )
    key, path = machine_key(), cache_path()
    cached = _read_cache(path, key)
    if cached is not None:
        return cached
    peaks = measure_cpu_peaks()
    log.info(
        "CPU peaks measured: %.3g FLOP/s (float32 matmul), %.3g B/s (copy)",
        peaks.flops_per_s,
        peaks.bandwidth_bytes_per_s,
    )
    _write_cache(path, peaks)
    return peaks


def cpu_hardware() -> Hardware:
    """The "cpu" preset: `NOMINAL_CPU` with the peak FLOP/s (every dtype) and the memory
    bandwidth of `cpu_peaks()`."""
    peaks = cpu_peaks()
    flops = peaks.flops_per_s
    return replace(
        NOMINAL_CPU,
        peak_flops=dict.fromkeys(NOMINAL_CPU.peak_flops, flops),
        memory_bandwidth=peaks.bandwidth_bytes_per_s,
    )


def get_hardware(name: str) -> Hardware:
    """The preset `name` (`cost_model.hardware.PRESETS`, `ALIASES`); "cpu" with this machine's
    measured peaks (`cpu_hardware`)."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key == "cpu":
        return cpu_hardware()
    try:
        return PRESETS[key]
    except KeyError:
        raise CostInputError(
            "hardware",
            f"unknown preset {name!r}; expected one of {', '.join([*PRESETS, *ALIASES])}",
        ) from None
