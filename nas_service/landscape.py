"""A job recorded as a *landscape*: its spec and every trial with its parameters, costs,
training settings, per-seed runs (tokens, FLOPs, wall time) and evaluation curve, and the
identity of the corpus the runs read (`LandscapeRead`, format `depthscope-landscape`).

A landscape is what a simulated run of a search replays instead of training (each trial's
curve and duration), and what a benchmark of search strategies measures against: a grid run
recorded once, replayed by every sampler. `GET /v1/jobs/{id}/landscape` and
`depthscope export JOB --out FILE` write one; `load_landscape` reads one back, checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from nas_service.api.schemas import LandscapeJobRead, LandscapeRead, TrialRead

FORMAT: Final = "depthscope-landscape"
VERSION = 1
#: The largest landscape file `load_landscape` reads (a 20,000-trial job is about 100 MB).
MAX_BYTES = 256 << 20


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
    """A landscape file read back and checked (at most `max_bytes`; its format, version and
    every field), or `LandscapeError` naming what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise LandscapeError("path", f"cannot read {path}: {exc.strerror or exc}") from None
    if size > max_bytes:
        raise LandscapeError("path", f"{size} bytes is over the limit of {max_bytes}")
    try:
        data = LandscapeRead.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "landscape"
        raise LandscapeError(where, str(first["msg"])) from None
    if data.version != VERSION:
        raise LandscapeError("version", f"version {data.version}; this one reads {VERSION}")
    return data
