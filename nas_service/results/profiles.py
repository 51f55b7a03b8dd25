"""Per-architecture profiles over training settings and the fixed-setting view (the
sensitivity of the loss to each training axis and the paired comparisons between residual
variants, over the profile, are `comparison`'s).

A job may train one architecture at several training settings (a per-shape `tune` grid, or
joint training axes that the sampler varies across trials). A shape that prefers another
learning rate than the one shared by every candidate loses for a reason that is not its
architecture, so every analysis reads the *profile*: per architecture (and budget), the best
mean loss over the settings it was trained at (`profile`). The *fixed view* (`fixed_view`)
is the counterfactual of a job with one setting for every shape.

Pure Python and numpy over `rows.TrialRow`s: no database, Optuna, torch or Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas_service.results.rows import TrialRow
from nas_service.search.numbers import is_finite
from nas_service.store import TrialStatus

#: A shape as comparisons match it: (n_layers, d_model, n_heads, budget).
Shape = tuple[int, int, int, float | None]
SettingKey = tuple[tuple[str, float], ...]


def _key(setting: dict[str, float]) -> SettingKey:
    return tuple(sorted((str(k), float(v)) for k, v in setting.items()))


def _budget_order(budget: float | None) -> float:
    return -1.0 if budget is None else budget


@dataclass(frozen=True)
class Record:
    """One training setting of one trained architecture: the trial, the setting, the mean
    final validation loss over its seeds and the per-seed losses (seed order)."""

    row: TrialRow
    setting: dict[str, float]
    mean: float
    losses: list[float | None]

    @property
    def setting_key(self) -> SettingKey:
        return _key(self.setting)


def records(rows: Iterable[TrialRow]) -> list[Record]:
    """Every setting of every completed, counted trial that trained to a finite mean (a
    setting with a diverged seed has no mean and no record). A trial from before settings
    were recorded gives one record, setting {} (`TrialRow` fills it in)."""
    out = []
    for r in rows:
        if r.state != TrialStatus.COMPLETE or r.lost:
            continue
        for entry in r.settings:
            mean = entry.get("mean")
            if mean is not None and is_finite(mean):
                out.append(Record(r, dict(entry["setting"]), float(mean), list(entry["losses"])))
    return out


@dataclass
class ProfileRow:
    """One architecture (at one budget) at one training setting: in `profile` its best,
    in `fixed_view` the shared one."""

    row: TrialRow  # the trial that trained it at `setting`
    setting: dict[str, float]
    loss: float  # mean final validation loss over the scoring seeds
    seeds: list[float | None]  # per-seed losses at `setting`, in seed order
    n_settings: int  # distinct settings this architecture was trained at (to a finite loss)
    n_trials: int  # trials of this architecture
    records: list[Record] = field(default_factory=list, repr=False)  # all of them
    #: the number of each seed of `seeds`; whether they are held-out confirmation seeds
    #: (the setting was chosen on others) or the seeds that chose it
    seed_ids: list[int] = field(default_factory=list)
    confirmed: bool = False

    @property
    def arch_key(self) -> tuple[Any, ...]:
        return self.row.arch_key

    @property
    def residual(self) -> str:
        return self.row.residual

    @property
    def variant(self) -> str:
        return self.row.variant

    @property
    def shape(self) -> Shape:
        _, n_layers, d_model, n_heads, budget = self.row.shape_key
        return (n_layers, d_model, n_heads, budget)

    @property
    def ratio(self) -> float:
        """d_model / L_b (0 where the architecture lacks them)."""
        a = self.row.arch
        return float(a["d_model"]) / float(a["n_layers"]) if a.get("n_layers") else 0.0

    def as_dict(self) -> dict[str, Any]:
        n_layers, d_model, n_heads, budget = self.shape
        return {
            "trial": self.row.number,
            "variant": self.residual,
            "n_layers": n_layers,
            "d_model": d_model,
            "n_heads": n_heads,
            "budget": budget,
            "setting": self.setting,
            "val_loss": self.loss,
            "seeds": self.seeds,
            "seed_ids": self.seed_ids,
            "confirmed": self.confirmed,
            "n_settings": self.n_settings,
            "n_trials": self.n_trials,
        }


def _by_arch(recs: Iterable[Record]) -> dict[tuple[Any, ...], list[Record]]:
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for rec in recs:
        groups.setdefault(rec.row.arch_key, []).append(rec)
    return groups


def _best(recs: Sequence[Record]) -> Record:
    """The lowest mean; ties by trial number, then setting (deterministic)."""
    return min(recs, key=lambda r: (r.mean, r.row.number, r.setting_key))


def _profile_row(best: Record, recs: Sequence[Record]) -> ProfileRow:
    """The architecture at its best setting, scored on its trial's confirmation seeds where
    the job confirms (the setting chosen on the tuning seeds, measured on fresh ones), else
    on the seeds that chose it."""
    row = best.row
    confirm = row.confirm
    if confirm is not None and confirm["mean"] is not None:
        setting, loss, seeds = dict(confirm["setting"]), confirm["mean"], confirm["losses"]
    else:
        setting, loss, seeds = best.setting, best.mean, best.losses
    return ProfileRow(
        row,
        setting,
        loss,
        list(seeds),
        n_settings=len({r.setting_key for r in recs}),
        n_trials=len({r.row.number for r in recs}),
        records=list(recs),
        seed_ids=list(confirm["seeds"]) if confirm is not None else list(range(len(seeds))),
        confirmed=confirm is not None,
    )


def _sorted(rows: list[ProfileRow]) -> list[ProfileRow]:
    def order(p: ProfileRow) -> tuple[Any, ...]:
        n_layers, d_model, n_heads, budget = p.shape
        return (p.residual, _budget_order(budget), n_layers, d_model, n_heads, p.row.number)

    return sorted(rows, key=order)


def profile(rows: Iterable[TrialRow]) -> list[ProfileRow]:
    """Per architecture and budget (`TrialRow.arch_key`): its best record over every
    training setting tried, across trials (joint axes train one architecture in several
    trials at different settings), with how many settings and trials it took. Sorted by
    variant label, budget, n_layers, d_model, n_heads."""
    return _sorted([_profile_row(_best(recs), recs) for recs in _by_arch(records(rows)).values()])


def fixed_view(rows: Iterable[TrialRow]) -> tuple[dict[str, float], list[ProfileRow]]:
    """The view of a job that trained every shape at one setting: (that setting, one row
    per architecture trained at it).

    The setting is the best single global one: among the settings tried on the most
    architectures, the one whose median loss over those architectures is lowest (an
    architecture trained at a setting in several trials counts its best). With a per-shape
    grid every setting is tried on every architecture, so this is the grid's best shared
    setting; with a continuous joint range few settings repeat, and the view holds as many
    architectures as the most shared setting has. ({}, []) when nothing was trained."""
    recs = records(rows)
    per_arch = _by_arch(recs)
    by_setting: dict[SettingKey, dict[tuple[Any, ...], Record]] = {}
    for rec in recs:
        held = by_setting.setdefault(rec.setting_key, {})
        arch = rec.row.arch_key
        if arch not in held or (rec.mean, rec.row.number) < (
            held[arch].mean,
            held[arch].row.number,
        ):
            held[arch] = rec
    if not by_setting:
        return {}, []
    most = max(len(v) for v in by_setting.values())
    chosen = min(
        (k for k, v in by_setting.items() if len(v) == most),
        key=lambda k: (float(np.median([r.mean for r in by_setting[k].values()])), k),
    )
    held = by_setting[chosen]
    out = [_profile_row(rec, per_arch[arch]) for arch, rec in held.items()]
    return dict(chosen), _sorted(out)
