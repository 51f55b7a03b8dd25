"""A spec or architecture file that is not a regular file (a FIFO, a device, a folder) is
refused on its opened descriptor, never read or waited on: `depthscope submit FIFO`, run as
a real process, exits 2 naming the path within seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nas_service.spec import SpecError, read_yaml_mapping
from tests.support.api import ROOT


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    os.mkfifo(path)
    return path


def depthscope(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "nas_service.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,  # a regression that blocks fails here rather than hanging the suite
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    return out, time.monotonic() - start


@pytest.mark.timeout(120)
def test_depthscope_submit_of_a_fifo_exits_2_naming_it(fifo: Path, tmp_path: Path) -> None:
    for path in (fifo, tmp_path, Path("/dev/zero"), tmp_path / "missing.yaml"):
        out, seconds = depthscope("submit", str(path), "--url", "http://127.0.0.1:9")
        assert out.returncode == 2, (path, out.returncode, out.stderr)
        assert str(path) in out.stderr and "depthscope submit" in out.stderr, out.stderr
        assert seconds < 20, seconds  # no wait on the FIFO, no read of the device


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field", ["spec", "arch"])
def test_a_yaml_file_that_is_not_a_regular_file_is_refused(
    fifo: Path, tmp_path: Path, field: str
) -> None:
    for path, reason in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (tmp_path, "not a regular file"),
        (tmp_path / "missing.yaml", "does not exist"),
    ):
        with pytest.raises(SpecError) as info:
            read_yaml_mapping(path, field)
        assert info.value.errors[0][0] == field
        assert str(path) in info.value.errors[0][1] and reason in info.value.errors[0][1]
