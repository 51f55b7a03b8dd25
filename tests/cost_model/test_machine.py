"""The CPU preset's measured peaks (`cost_model.machine`): positive and plausible (never a
speed the test depends on), measured once per process and once per machine (the disk cache),
nominal on request, a bad setting refused naming the variable, and torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cost_model import CostInputError, get_hardware, machine
from cost_model.hardware import NOMINAL_CPU


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """An empty cache folder, the process cache cleared, and measurements counted (each the
    real measurement, on small arrays to keep the test short)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(machine.PEAKS_ENV, raising=False)
    calls: list[int] = []
    real = machine.measure_cpu_peaks

    def counted() -> machine.CpuPeaks:
        calls.append(1)
        return real(matmul_n=256, copy_elements=2**20, budget_s=0.05, repeats=3)

    monkeypatch.setattr(machine, "measure_cpu_peaks", counted)
    machine.cpu_peaks.cache_clear()
    yield calls
    machine.cpu_peaks.cache_clear()


def test_measured_peaks_are_positive_and_plausible() -> None:
    peaks = machine.measure_cpu_peaks(matmul_n=256, copy_elements=2**20, budget_s=0.05)
    assert 1e8 < peaks.flops_per_s < 1e15  # 0.1 GFLOP/s to 1 PFLOP/s
    assert 1e8 < peaks.bandwidth_bytes_per_s < 1e13
    assert peaks.matmul_n == 256 and peaks.copy_bytes == 4 * 2**20
    assert peaks.source == "measured" and peaks.machine == machine.machine_key()


def test_measured_once_per_process_and_once_per_machine(fresh_cache: list[int]) -> None:
    first = machine.cpu_peaks()
    assert first.source == "measured" and len(fresh_cache) == 1
    assert machine.cpu_peaks() is first and len(fresh_cache) == 1  # the process cache
    stored = json.loads(machine.cache_path().read_text())
    assert stored["machines"][machine.machine_key()]["flops_per_s"] == first.flops_per_s
    machine.cpu_peaks.cache_clear()  # a new process: the disk cache answers
    again = machine.cpu_peaks()
    assert again.source == "cache" and len(fresh_cache) == 1
    assert again.flops_per_s == first.flops_per_s
    assert again.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s


def test_the_cpu_preset_has_the_measured_peaks(fresh_cache: list[int]) -> None:
    hw = get_hardware("cpu")
    peaks = machine.cpu_peaks()
    assert all(hw.peak(d) == peaks.flops_per_s for d in ("float32", "bfloat16", "float16"))
    assert hw.memory_bandwidth == peaks.bandwidth_bytes_per_s
    assert hw.memory_bytes == NOMINAL_CPU.memory_bytes and hw.name == "cpu"
    assert get_hardware("CPU").peak("float32") == peaks.flops_per_s
    assert len(fresh_cache) == 1


def test_a_corrupt_or_foreign_cache_is_measured_again(fresh_cache: list[int]) -> None:
    path = machine.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert machine.cpu_peaks().source == "measured" and len(fresh_cache) == 1
    machine.cpu_peaks.cache_clear()
    data = json.loads(path.read_text())
    data["machines"][machine.machine_key()]["flops_per_s"] = -1.0  # not a peak
    path.write_text(json.dumps(data))
    assert machine.cpu_peaks().source == "measured" and len(fresh_cache) == 2
    machine.cpu_peaks.cache_clear()
    path.write_text(json.dumps({"version": 0, "machines": data["machines"]}))
    assert machine.cpu_peaks().source == "measured" and len(fresh_cache) == 3


def test_nominal_on_request(fresh_cache: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(machine.PEAKS_ENV, "nominal")
    hw = get_hardware("cpu")
    assert hw.peak("float32") == NOMINAL_CPU.peak("float32")
    assert hw.memory_bandwidth == NOMINAL_CPU.memory_bandwidth
    assert fresh_cache == [] and not machine.cache_path().exists()


def test_a_bad_setting_is_refused_naming_it(
    fresh_cache: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(machine.PEAKS_ENV, "fast")
    with pytest.raises(CostInputError) as info:
        get_hardware("cpu")
    assert info.value.field == machine.PEAKS_ENV and "'fast'" in info.value.reason


def test_an_unwritable_cache_still_measures(
    fresh_cache: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: no folder can be made
    assert machine.cpu_peaks().flops_per_s > 0 and len(fresh_cache) == 1


def test_a_torch_free_process_measures(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from cost_model import get_hardware\n"
        "hw = get_hardware('cpu')\n"
        "assert hw.peak('float32') > 0 and hw.memory_bandwidth > 0\n"
        "assert 'torch' not in sys.modules\n"
        "print(hw.peak('float32'))\n"
    )
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "depthscope" / "cpu_peaks.json").exists()
