"""What a recorded landscape answers for a run (`nas_service.runner.simulated`): its trials
grouped by setting and seed, the nearest recorded architecture and setting to a run's, and
the recorded evaluation curve read at any fraction of the run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_model import ArchConfig
from cost_model.residuals import DEPTH_MIXED
from nas_service.store.records import TrainRunRead, TrialRead
from workers.contract import TrainSpec


class SimulatedLookupError(ValueError):
    """The landscape records nothing a run could be answered from (the run fails)."""


@dataclass
class Setting:
    setting: dict[str, float]
    runs: dict[int, TrainRunRead]  # by seed


@dataclass
class Curve:
    """An evaluation curve: L at token fractions x of its run (0 first, at ln vocab), the
    evaluations' steps as fractions of the run's steps."""

    xs: list[float]
    losses: list[float]
    step_fractions: list[float]
    steps: int

    @property
    def final(self) -> float:
        return self.losses[-1]


@dataclass
class Recorded:
    """A recorded trial, ready to answer runs."""

    trial: TrialRead
    arch: ArchConfig
    settings: list[Setting]
    curve: Curve  # the chosen setting's seed-0 curve


def trainable(trial: TrialRead) -> bool:
    return (
        bool(trial.arch) and bool(trial.train) and curve_of(trial.curve, arch_of(trial)) is not None
    )


def arch_of(trial: TrialRead) -> ArchConfig:
    return ArchConfig(**trial.arch)  # type: ignore[arg-type]


def record(trial: TrialRead) -> Recorded:
    arch = arch_of(trial)
    chosen = dict(trial.setting)
    groups: dict[tuple[tuple[str, float], ...], Setting] = {}
    for run in trial.train:
        setting = dict(run.setting or chosen)
        key = tuple(sorted(setting.items()))
        groups.setdefault(key, Setting(setting, {})).runs.setdefault(run.seed or 0, run)
    curve = curve_of(trial.curve, arch)
    assert curve is not None  # `trainable`
    return Recorded(trial=trial, arch=arch, settings=list(groups.values()), curve=curve)


def curve_of(rows: list[list[float | None]] | None, arch: ArchConfig) -> Curve | None:
    """A recorded curve's rows [step, tokens, flops, val_loss] (None: none kept)."""
    points = [
        (float(r[0]), float(r[1]), float(r[3]))
        for r in rows or []
        if r[0] is not None and r[1] is not None and r[3] is not None
    ]
    if not points or points[-1][1] <= 0:
        return None
    last_step, last_tokens = points[-1][0], points[-1][1]
    return Curve(
        xs=[0.0] + [tokens / last_tokens for _, tokens, _ in points],
        losses=[math.log(arch.vocab_size)] + [loss for _, _, loss in points],
        step_fractions=[step / last_step for step, _, _ in points],
        steps=int(last_step),
    )


def nearest_setting(recs: list[Recorded], spec: TrainSpec) -> tuple[Recorded, Setting]:
    """The recorded setting nearest to the run's, among every setting of `recs` (one
    architecture), and the trial that recorded it."""
    pool = [(r, s) for r in recs for s in r.settings]
    exact = [
        (r, s)
        for r, s in pool
        if s.setting.get("warmup_frac") == spec.warmup_frac
        and s.setting.get("weight_decay") == spec.weight_decay
    ]
    pool = exact or pool
    if not pool:
        raise SimulatedLookupError(f"landscape trial {recs[0].trial.number} records no run")
    mixed = spec.arch.variant in DEPTH_MIXED

    def distance(pair: tuple[Recorded, Setting]) -> float:
        setting = pair[1].setting
        d = abs(_log(spec.lr) - _log(setting.get("lr", spec.lr)))
        if mixed:
            d += abs(_log(spec.depth_lr_mult) - _log(setting.get("depth_lr_mult", 1.0)))
        return d

    return min(pool, key=distance)


def _log(x: float) -> float:
    return math.log(max(x, 1e-12))  # depth_lr_mult 0 (frozen mixing) is far from any other


def interp(x: float, xs: list[float], ys: list[float], scale: float) -> float:
    """The curve at token fraction `x`, linear between its points; the recorded points (not
    the ln(vocab) start) scaled by `scale`."""
    x = min(max(x, 0.0), xs[-1])
    for i in range(1, len(xs)):
        if x <= xs[i]:
            y0 = ys[i - 1] * (scale if i > 1 else 1.0)
            y1 = ys[i] * scale
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
            return y0 + w * (y1 - y0)
    return ys[-1] * scale


def nearest(recorded: list[Recorded], arch: ArchConfig) -> list[Recorded]:
    """The recorded trials of the nearest architecture (several when a joint training
    axis made one trial per setting)."""
    same = [
        r
        for r in recorded
        if r.arch.variant == arch.variant and r.arch.block_size == arch.block_size
    ]
    if not same:
        block = f" with block size {arch.block_size}" if arch.block_size else ""
        raise SimulatedLookupError(f"the landscape records no trial of {arch.variant}{block}")

    def distance(r: Recorded) -> float:
        return abs(math.log(arch.n_layers / r.arch.n_layers)) + abs(
            math.log(arch.d_model / r.arch.d_model)
        )

    nearest = min(same, key=distance).arch
    return [r for r in same if r.arch == nearest]
