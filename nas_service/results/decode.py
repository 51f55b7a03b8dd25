"""A stored trial as a results row (`TrialRow`): its parameters, architecture, every metric
(the measured loss and each cost), outcome, training settings and curve, decoded from the
attributes the runner and the search wrote on it. The trials come in bulk from Optuna's tables
(`store.trial_tables.read_trials`: a few statements through Optuna's own table definitions,
decoded as its storage decodes them, and never written), not through Optuna's storage, which
builds an ORM object per stored row and a `FrozenTrial` per trial."""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas_service.results.rows import TrialRow, setting_key
from nas_service.search.numbers import finite_or_none as _loss_or_none
from nas_service.search.numbers import is_finite
from nas_service.store import TrialOutcome, TrialStatus
from nas_service.store.optuna_study import trial_id_of
from nas_service.store.records import (
    ConfirmRecord,
    SettingRecord,
    TrainRun,
    TrialAttr,
    TrialRecord,
)
from nas_service.store.trial_tables import StoredTrial

STATE_NAMES = {
    TrialState.COMPLETE: TrialStatus.COMPLETE,
    TrialState.PRUNED: TrialStatus.PRUNED,
    TrialState.FAIL: TrialStatus.FAILED,
    TrialState.RUNNING: TrialStatus.RUNNING,
    TrialState.WAITING: TrialStatus.WAITING,
}


def _outcome(t: StoredTrial | FrozenTrial) -> TrialOutcome | str:
    value = t.user_attrs.get(TrialAttr.OUTCOME)
    if value is None:
        return TrialOutcome.RUNNING if t.state == TrialState.RUNNING else ""
    try:
        return TrialOutcome(value)
    except ValueError:  # written by something else than this service
        return str(value)


def _row(t: StoredTrial | FrozenTrial, objectives: list[str], budget: float | None) -> TrialRow:
    rec = TrialRecord.from_attrs(t.user_attrs)
    metrics = dict(rec.costs or {})
    train = rec.train or []
    if t.state == TrialState.COMPLETE and t.values is not None:
        for name, value in zip(objectives, t.values, strict=False):
            metrics[name] = value
    elif train and (first_loss := train[0].get("final_val_loss")) is not None:
        metrics["val_loss"] = first_loss
    seeds: Any = rec.seeds or {}
    if "val_loss" not in metrics and isinstance(seeds.get("mean"), int | float):
        metrics["val_loss"] = float(seeds["mean"])  # a job whose objective is val_bpb
    if "val_bpb" not in metrics:  # the loss in bits per byte, where the corpus is text
        bpb = rec.bpb if t.state == TrialState.COMPLETE else None
        if bpb is None and "val_loss" in metrics and train and t.state != TrialState.COMPLETE:
            bpb = train[0].get("final_val_bpb")
        if isinstance(bpb, int | float) and not isinstance(bpb, bool):
            metrics["val_bpb"] = float(bpb)
    duration = None
    if t.datetime_start and t.datetime_complete:
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
    setting = {str(k): float(v) for k, v in (rec.setting or {}).items()}
    settings: list[SettingRecord] = [
        {
            "setting": {str(k): float(v) for k, v in (e.get("setting") or {}).items()},
            "losses": [_loss_or_none(v) for v in e.get("losses", [])],
            "mean": _loss_or_none(e.get("mean")),
        }
        for e in rec.settings or []
    ]
    confirm = _confirm(rec.confirm)
    return TrialRow(
        number=t.number,
        state=STATE_NAMES[t.state],
        outcome=_outcome(t),
        reason=str(rec.reason or ""),
        params=dict(t.params),
        arch=dict(rec.arch or {}),
        metrics=metrics,
        values=list(t.values) if t.values is not None else None,
        train=train,
        curve=rec.curve or [],
        lost=bool(rec.lost),
        duration_s=duration,
        budget=float(t.params["budget"]) if "budget" in t.params else budget,
        trial_id=t.trial_id if isinstance(t, StoredTrial) else trial_id_of(t),
        setting=setting,
        settings=settings,
        seeds=list(confirm["losses"]) if confirm else _seeds(seeds, train, setting, settings),
        confirm=confirm,
        rungs=rec.rungs or [],
        waiting=rec.waiting,
        retry_of=rec.retry_of,
        suspect=rec.suspect,
        seed_stats=_seed_stats(seeds),
    )


def _confirm(value: Any) -> ConfirmRecord | None:
    """The `confirm` attribute as written (None when absent or not of that shape)."""
    if not isinstance(value, dict) or not isinstance(value.get("seeds"), list):
        return None
    seeds = [int(k) for k in value["seeds"] if isinstance(k, int) and not isinstance(k, bool)]
    losses = value.get("losses")
    losses = [_loss_or_none(v) for v in losses] if isinstance(losses, list) else []
    if len(seeds) != len(value["seeds"]) or len(losses) != len(seeds):
        return None
    return {
        "setting": {str(k): float(v) for k, v in (value.get("setting") or {}).items()},
        "seeds": seeds,
        "losses": losses,
        "mean": _loss_or_none(value.get("mean")),
    }


def _seed_stats(seeds: Any) -> dict[str, float] | None:
    """The chosen setting's seed statistics (`val_loss_seeds`: mean, std, min, max), the
    finite ones; None when the trial has none."""
    stats = {k: float(v) for k, v in seeds.items() if k not in ("values", "seeds") and is_finite(v)}
    return stats or None


def _seeds(
    stats: Any,
    train: list[TrainRun],
    setting: dict[str, float],
    settings: list[SettingRecord],
) -> list[float | None]:
    """The chosen setting's final loss per seed: from its `settings` entry, else from
    `val_loss_seeds` (older trials); a trial still training: its finished runs at the
    setting of its first run (so far)."""
    chosen = setting_key(setting)
    for entry in settings:
        if setting_key(entry["setting"]) == chosen:
            return list(entry["losses"])
    values = stats.get("values")
    if values is not None:
        return [_loss_or_none(v) for v in values]
    if not train:
        return []
    first = train[0].get("setting")
    return [_loss_or_none(r.get("final_val_loss")) for r in train if r.get("setting") == first]
