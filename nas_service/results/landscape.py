"""A job recorded as a *landscape*: its spec and every trial with its parameters, costs,
training settings, per-seed runs (tokens, FLOPs, wall time) and evaluation curve, and the
identity of the corpus the runs read (`LandscapeRead`, format `depthscope-landscape`).

A landscape is what a simulated run of a search replays instead of training (each trial's
curve and duration), and what a benchmark of search strategies measures against: a grid run
recorded once, replayed by every sampler. `GET /v1/jobs/{id}/landscape` and
`depthscope export JOB --out FILE` write one; `load_landscape` reads one back, checked.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from nas_service.results.reads import LandscapeJobRead, LandscapeRead, TrialRead

FORMAT: Final = "depthscope-landscape"
VERSION = 1
#: The largest landscape file `load_landscape` reads (a 20,000-trial job is about 100 MB).
MAX_BYTES = 256 << 20
#: At most one JSON value per this many bytes of `max_bytes` (a real landscape holds one per
#: ~22 bytes): what bounds the memory a file of tiny values decodes to.
BYTES_PER_VALUE = 16


class LandscapeError(ValueError):
    """A file that is not a landscape this version reads (`field`, `reason`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def corpus_identity(trials: list[TrialRead]) -> dict[str, Any] | None:
    """The corpus every run reported; None when no run reported one, or when runs disagree
    (a registered corpus replaced under a running job): each run keeps its own."""
    seen = {tuple(sorted(run.corpus.items())) for t in trials for run in t.train if run.corpus}
    return dict(seen.pop()) if len(seen) == 1 else None


def landscape(job: LandscapeJobRead, trials: list[TrialRead]) -> LandscapeRead:
    """The landscape of `job` from its trials (each with its curve)."""
    return LandscapeRead(
        format=FORMAT, version=VERSION, job=job, corpus=corpus_identity(trials), trials=trials
    )


def load_landscape(path: str | Path, max_bytes: int = MAX_BYTES) -> LandscapeRead:
    """A landscape file read back and checked, or `LandscapeError` naming what is wrong.

    Only a regular file is read (a device, a FIFO or a folder is refused on its opened
    descriptor, never read or waited on), at most `max_bytes` of it, holding at most one
    JSON value per `BYTES_PER_VALUE` bytes of that limit (counted before parsing: a file of
    empty lists decodes to some 35 times its size, a real landscape to about 7, so the
    densest file let through needs less memory than a real one at the byte limit); then its
    format, version and every field, and every number finite (NaN, ±Infinity and literals
    that overflow, like 1e999, are refused naming where they are)."""
    path = Path(path)
    raw = _read_regular(path, max_bytes)
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")  # bounds the values
    max_values = max_bytes // BYTES_PER_VALUE
    if values > max_values:
        raise LandscapeError(
            "path",
            f"{path} holds about {values} JSON values, over the limit of {max_values} "
            f"(one per {BYTES_PER_VALUE} bytes of the {max_bytes}-byte limit)",
        )
    try:
        data = LandscapeRead.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "landscape"
        raise LandscapeError(where, str(first["msg"])) from None
    finally:
        del raw
    if data.version != VERSION:
        raise LandscapeError("version", f"version {data.version}; this one reads {VERSION}")
    bad = _non_finite(data, ())
    if bad is not None:
        raise LandscapeError(".".join(map(str, bad)) or "landscape", "is not a finite number")
    return data


def _read_regular(path: Path, max_bytes: int) -> bytes:
    """At most `max_bytes` of the regular file `path`: opened without blocking (a FIFO
    returns at once), its descriptor's type checked, then read; more is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LandscapeError("path", f"{path} does not exist") from None
    except OSError as exc:
        raise LandscapeError("path", f"cannot read {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LandscapeError("path", f"{path} is not a regular file")
        raise LandscapeError("path", f"{st.st_size} bytes is over the limit of {max_bytes}")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(max_bytes + 1)  # the file may have grown since fstat
        except OSError as exc:
            raise LandscapeError("path", f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise LandscapeError("path", f"{path} is over the limit of {max_bytes} bytes")
    return raw


def _non_finite(value: Any, where: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """Where the first NaN or infinity lies in `value` (models, lists, dicts), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, BaseModel):
        items: Iterable[tuple[str | int, Any]] = value.__dict__.items()
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, (*where, key))
        if found is not None:
            return found
    return None
