"""The job's plots as PNG images: the Pareto front, the optimum per variant, the paired
comparison and the calibration, each drawn (`analysis`, `calibration`) from the same answer
as its JSON query (`queries`)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from nas_service.results import analysis
from nas_service.results.answers import optimum_by_variant, pareto_rows
from nas_service.results.cache import ResultsCache, job_results
from nas_service.results.calibration import plot_calibration
from nas_service.results.queries import (
    NothingYet,
    ParetoAsk,
    _comparison,
    calibration,
    job_row,
)


def compare_png(
    session: Session, cache: ResultsCache, job_id: str, reference: str, level: float = 0.95
) -> bytes:
    """The paired difference against depth per variant, with its intervals, as a PNG."""
    job = job_row(session, cache, job_id)
    out = _comparison(job_results(cache, job), reference, level)
    if not out["pairs"]:
        raise NothingYet(
            "reference", f"no shape has been trained with both {reference} and another variant"
        )
    return _png(lambda path: analysis.plot_compare(out, path))


def calibration_png(
    session: Session, cache: ResultsCache, job_id: str, scope: str = "job"
) -> bytes:
    """Predicted against measured step time, log-log, with the y = x line: the raw roofline
    and (where fitted) the calibrated model's out-of-fold predictions, per device kind."""
    answer = calibration(session, cache, job_id, scope)
    if not answer.groups:
        raise NothingYet("job_id", answer.message)
    return _png(lambda path: plot_calibration(answer, path))


def _png(draw: Callable[[str], Any]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plot.png"
        draw(str(path))
        return path.read_bytes()


def pareto_png(session: Session, cache: ResultsCache, job_id: str, ask: ParetoAsk) -> bytes:
    """The front over the first two of `ask`'s metrics among the candidates, as a PNG."""
    names = list(ask.metrics[:2])
    front, candidates = pareto_rows(
        job_results(cache, job_row(session, cache, job_id)), names, ask.variant, ask.profile
    )
    if not candidates:
        raise NothingYet("metrics", "no trial has these metrics yet")
    index = {id(r): i for i, r in enumerate(candidates)}
    return _png(
        lambda path: analysis.plot_pareto(
            [r.metrics[names[1]] for r in candidates],
            [r.metrics[names[0]] for r in candidates],
            [index[id(r)] for r in front],
            [r.variant for r in candidates],
            names[1],
            names[0],
            path,
        )
    )


def optimum_png(session: Session, cache: ResultsCache, job_id: str, profile: bool = True) -> bytes:
    """Loss against d_model/L_b per variant with its fitted optimum, as a PNG."""
    results = job_results(cache, job_row(session, cache, job_id))
    fits = optimum_by_variant(results, 100, profile=profile)
    if not fits:
        raise NothingYet("job_id", "no trained trial yet")
    several = len({f["budget"] for f in fits}) > 1

    def label(f: dict[str, Any]) -> str:
        return f"{f['variant']} @ {f['budget']:.3g}" if several else str(f["variant"])

    data = {label(f): f["_data"] for f in fits}
    fit_map = {label(f): f["_fit"] for f in fits}
    return _png(lambda path: analysis.plot_optimum(data, fit_map, path))
