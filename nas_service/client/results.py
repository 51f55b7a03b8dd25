"""The client's tabular answers: the API's own schemas (`nas_service.api.schemas`), each with
a `to_pandas()` added, one row per trial (trials, a Pareto front, a landscape), per fit
(optimum), per matched pair (compare) or per point of a curve (sensitivity). The fields are
the schemas' (subclasses add no field: one description of each answer).

pandas is optional (`pip install 'depthscope[pandas]'`); without it `to_pandas` raises an
`ImportError` that says so. Importing this module imports the schemas (pydantic, the cost
model's constants, the database layer's enums), never torch or Ray."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nas_service.api.schemas import (
    CompareRead,
    LandscapeRead,
    OptimumRead,
    ParetoRead,
    SensitivityRead,
    TrialList,
    TrialRead,
)

__all__ = ["Comparison", "Landscape", "Optimum", "Pareto", "Sensitivity", "Trials"]


def _frame(rows: list[dict[str, Any]], columns: Iterable[str]) -> Any:
    """A `pandas.DataFrame` of `rows`, at least `columns` (in that order) even when empty."""
    import importlib

    try:
        pd = importlib.import_module("pandas")
    except ImportError:
        raise ImportError(
            "to_pandas needs pandas: pip install 'depthscope[pandas]' (or pandas)"
        ) from None
    first = list(columns)
    rest = list(dict.fromkeys(k for row in rows for k in row if k not in first))
    return pd.DataFrame(rows, columns=first + rest)


#: A trial row's leading columns; then the architecture's fields, `metric.*`, `setting.*`.
TRIAL_COLUMNS = ("number", "state", "outcome", "reason", "variant", "duration_s", "budget")


def _trial_rows(trials: Iterable[TrialRead]) -> list[dict[str, Any]]:
    rows = []
    for t in trials:
        row: dict[str, Any] = {
            "number": t.number,
            "state": t.state.value,
            "outcome": t.outcome,
            "reason": t.reason,
            "variant": t.variant,
            "duration_s": t.duration_s,
            "budget": t.budget,
        }
        row |= {f"arch.{k}": v for k, v in t.arch.items()}
        row |= {f"metric.{k}": v for k, v in t.metrics.items()}
        row |= {f"setting.{k}": v for k, v in t.setting.items()}
        row["seeds"] = len(t.seeds)
        rows.append(row)
    return rows


class Trials(TrialList):
    """`GET /v1/jobs/{id}/trials` (every page): `to_pandas()` has a row per trial."""

    def to_pandas(self) -> Any:
        return _frame(_trial_rows(self.items), TRIAL_COLUMNS)


class Pareto(ParetoRead):
    """`GET /v1/jobs/{id}/pareto`: `to_pandas()` has a row per trial of the front."""

    def to_pandas(self) -> Any:
        return _frame(_trial_rows(self.front), TRIAL_COLUMNS)


class Landscape(LandscapeRead):
    """`GET /v1/jobs/{id}/landscape`: `to_pandas()` has a row per trial."""

    def to_pandas(self) -> Any:
        return _frame(_trial_rows(self.trials), TRIAL_COLUMNS)


OPTIMUM_COLUMNS = (
    "variant",
    "budget",
    "verdict",
    "optimum_ratio",
    "ci_low",
    "ci_high",
    "fitted_loss",
    "n_shapes",
    "n_trials",
    "view",
    "best_trial",
    "best_val_loss",
    "best_n_layers",
    "best_d_model",
    "moved",
    "message",
)


class Optimum(OptimumRead):
    """`GET /v1/jobs/{id}/optimum`: `to_pandas()` has a row per fit (variant, budget)."""

    def to_pandas(self) -> Any:
        rows = []
        for f in self.fits:
            best = f.best_observed
            rows.append(
                {
                    "variant": f.variant,
                    "budget": f.budget,
                    "verdict": f.verdict,
                    "optimum_ratio": f.optimum_ratio,
                    "ci_low": f.ci_low,
                    "ci_high": f.ci_high,
                    "fitted_loss": f.fitted_loss,
                    "n_shapes": f.n_shapes,
                    "n_trials": f.n_trials,
                    "view": f.view,
                    "best_trial": best.trial if best else None,
                    "best_val_loss": best.val_loss if best else None,
                    "best_n_layers": best.n_layers if best else None,
                    "best_d_model": best.d_model if best else None,
                    "moved": f.moved,
                    "message": f.message,
                }
            )
        return _frame(rows, OPTIMUM_COLUMNS)


PAIR_COLUMNS = (
    "variant",
    "n_layers",
    "sublayers",
    "d_model",
    "n_heads",
    "budget",
    "seeds",
    "mean",
    "ci_low",
    "ci_high",
    "verdict",
    "trial",
    "reference_trial",
)


class Comparison(CompareRead):
    """`GET /v1/jobs/{id}/compare`: `to_pandas()` has a row per matched shape (the mean
    paired difference, variant − reference, its interval and verdict)."""

    def to_pandas(self) -> Any:
        rows = [
            {k: getattr(p, k) for k in PAIR_COLUMNS if k != "seeds"} | {"seeds": len(p.seeds)}
            for p in self.pairs
        ]
        return _frame(rows, PAIR_COLUMNS)


CURVE_COLUMNS = ("variant", "axis", "n_layers", "d_model", "n_heads", "budget", "value", "loss")


class Sensitivity(SensitivityRead):
    """`GET /v1/jobs/{id}/sensitivity`: `to_pandas()` has a row per point of every curve
    (the loss at one value of one training axis, for one shape of one variant)."""

    def to_pandas(self) -> Any:
        rows = []
        for v in self.variants:
            for axis in v.axes:
                for c in axis.curves:
                    shape = {
                        "n_layers": c.n_layers,
                        "d_model": c.d_model,
                        "n_heads": c.n_heads,
                        "budget": c.budget,
                    }
                    for value, loss in c.points:
                        rows.append(
                            {"variant": v.variant, "axis": axis.axis}
                            | shape
                            | {"value": value, "loss": loss}
                        )
        return _frame(rows, CURVE_COLUMNS)
