"""A job's spec as the database holds it, read back without searching anything again.

A spec is validated completely once, at submission (`parse_spec`, `check_job`). What a job
row holds is that spec's `model_dump`: reading it back (`read_stored`) checks its structure
and its own fields as `JobSpec` does, but not what costs a search — `cost.layout: auto`'s
layouts (up to `MAX_SEARCH_LAYOUTS`) were counted at submission and are not enumerated
again. A row this version no longer reads (a variant or a field since removed, a hand-edited
row, a non-finite number) is no error: it is a `StoredSpec` without `spec`, with the row as
stored (`data`, every non-finite number written as its name) and the reason naming the
fields, which the API shows, and with which the runner fails the job."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nas_service.spec.fields import SpecError
from nas_service.spec.model import JobSpec, parse_spec
from nas_service.spec.training import Training

#: The validation context of a stored spec: `CostContext` does not enumerate its layouts.
STORED: dict[str, bool] = {"stored": True}


@dataclass(frozen=True)
class StoredSpec:
    """`spec`: the stored spec as a `JobSpec`, or None when this version does not read it,
    then `reason` says why (the fields and their problems, as `SpecError` words them).
    `data`: the row as stored, JSON-safe (a non-finite number as "NaN", "Infinity" or
    "-Infinity"; a row that is no mapping as {"stored": row})."""

    data: dict[str, Any]
    spec: JobSpec | None
    reason: str | None

    @property
    def objectives(self) -> list[str]:
        """The objectives, also of a stale row where they read as a list of names (else
        `val_loss`)."""
        if self.spec is not None:
            return list(self.spec.objectives)
        value = self.data.get("objectives")
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return list(value)
        return ["val_loss"]

    @property
    def budget(self) -> tuple[str, list[float]]:
        """("flops" or "tokens", the budgets per candidate), also of a stale row as far as it
        reads (its finite positive numbers; none: [])."""
        if self.spec is not None:
            b = self.spec.budget
            kind = "flops" if b.flops is not None else "tokens"
            value = b.flops if b.flops is not None else b.tokens
            values = value if isinstance(value, list) else [value]
            return kind, [float(v) for v in values if v is not None]
        raw = self.data.get("budget")
        raw = raw if isinstance(raw, dict) else {}
        kind = "tokens" if raw.get("flops") is None and raw.get("tokens") is not None else "flops"
        value = raw.get(kind)
        items = value if isinstance(value, list) else [value]
        return kind, [
            float(v)
            for v in items
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        ]

    @property
    def single_budget(self) -> float | None:
        """The one budget of every candidate; None where the budget is a list (a searched
        axis, each trial's own) or unreadable."""
        raw = self.data.get("budget")
        if self.spec is not None:
            b = self.spec.budget
            value = b.flops if b.flops is not None else b.tokens
            return None if isinstance(value, list) or value is None else float(value)
        _, values = self.budget
        value = (raw.get("flops") or raw.get("tokens")) if isinstance(raw, dict) else None
        return values[0] if values and not isinstance(value, list) else None

    @property
    def batch_size(self) -> int:
        """Sequences per optimizer step of every run (`training.batch_size`), also of a stale
        row where it reads as a positive whole number (else the section's default)."""
        if self.spec is not None:
            return self.spec.training.batch_size
        training = self.data.get("training")
        value = training.get("batch_size") if isinstance(training, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        default: int = Training.model_fields["batch_size"].default
        return default


def read_stored(data: Any) -> StoredSpec:
    """The stored spec `data` as a `StoredSpec` (never raises for what a row may hold)."""
    shown = _json_safe(data)
    if not isinstance(shown, dict):
        return StoredSpec({"stored": shown}, None, "spec: the stored spec is not a mapping")
    try:
        spec = parse_spec_stored(data)
    except SpecError as exc:
        return StoredSpec(shown, None, str(exc))
    return StoredSpec(shown, spec, None)


def parse_spec_stored(data: Any) -> JobSpec:
    """`parse_spec` for a spec validated at submission: the same checks but the layout
    enumeration of `cost.layout: auto` (`STORED`). Raises `SpecError`."""
    return parse_spec(data, context=STORED)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
