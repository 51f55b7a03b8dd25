"""`load_landscape` given what is not a landscape file: a device, a FIFO, a folder, NaN or
infinity, a file over the byte limit, one whose decoded values are over the limit. Each is a
`LandscapeError` naming the field and the reason, at once (a FIFO never blocks)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nas_service.results.landscape import LandscapeError, load_landscape
from tests.support.api import ROOT

SHIPPED = ROOT / "bench/landscapes/crossover.json"


def refused(path: Path | str, field: str, *needles: str, **kwargs: int) -> LandscapeError:
    with pytest.raises(LandscapeError) as info:
        load_landscape(path, **kwargs)
    assert info.value.field == field, info.value
    for needle in needles:
        assert needle in info.value.reason, (needle, info.value.reason)
    return info.value


@pytest.mark.timeout(30)  # reading /dev/zero would run until memory ran out
def test_a_device_is_refused_before_any_read() -> None:
    refused("/dev/zero", "path", "/dev/zero", "not a regular file")


@pytest.mark.timeout(30)  # opening a FIFO for reading blocks until a writer comes
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")
    refused(tmp_path / "pipe.json", "path", "pipe.json", "not a regular file")


def test_a_folder_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, "path", str(tmp_path), "not a regular file")
    refused(tmp_path / "gone.json", "path", "gone.json", "does not exist")


@pytest.mark.parametrize(
    ("where", "literal"),
    [
        (("trials", 0, "train", 0, "final_val_loss"), "NaN"),
        (("trials", 1, "curve", 2, 3), "Infinity"),
        (("trials", 2, "metrics", "params"), "-Infinity"),
        (("trials", 3, "duration_s"), "1e999"),  # overflows to infinity as it is read
    ],
)
def test_non_finite_numbers_are_refused_naming_where(
    tmp_path: Path, where: tuple[str | int, ...], literal: str
) -> None:
    data = json.loads(SHIPPED.read_text())
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = "__HERE__"
    path = tmp_path / "l.json"
    path.write_text(json.dumps(data).replace('"__HERE__"', literal))
    refused(path, ".".join(map(str, where)), "not a finite number")


def test_the_limits_count_bytes_and_decoded_values(tmp_path: Path) -> None:
    refused(SHIPPED, "path", "over the limit", max_bytes=1000)
    # 600 kB of empty curve rows: under the byte limit, but ~400,000 values decode to some
    # 35 times the file's size in memory; refused before parsing, by their count
    data = json.loads(SHIPPED.read_text())
    data["trials"][0]["curve"] = [[] for _ in range(200_000)]
    dense = tmp_path / "dense.json"
    dense.write_text(json.dumps(data, separators=(",", ":")))
    assert dense.stat().st_size < 2**20
    refused(dense, "path", "values", "over the limit", max_bytes=2**20)
    assert len(load_landscape(dense, max_bytes=16 * 2**20).trials[0].curve or []) == 200_000
    assert load_landscape(SHIPPED).trials  # a real one still loads under the defaults
