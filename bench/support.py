"""Helpers shared by the benchmarks (and the read-path tests): synthetic trials, and a
throw-away PostgreSQL database.

`synthetic_trials`: `n` finished trials with the attributes the runner writes
(architecture, every cost metric, the training summary, a curve), without training
anything; losses follow a quadratic in ln(d_model/L_b) with a known minimum, plus noise.
`store_trials`: finished trials added to a study in one transaction, a few bulk statements
in all (`nas_service.store.trial_tables.insert_trials`), stored as `Study.add_trials` stores them
(tested equal): Optuna adds a trial at a time, about 25 ms each on two cores, four minutes
for 10,000.

bench/ is no package (and bench/cost_model.py would shadow the real one on sys.path), so the
scripts load this file by its path."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from cost_model import ArchConfig, price
from nas_service.spec import CandidateSpace, JobSpec, decode_residual
from nas_service.store.trial_tables import add_finished_trials


def synthetic_trials(
    spec: JobSpec, n: int, optimum: float = 40.0, seed: int = 0
) -> list[optuna.trial.FrozenTrial]:
    rng = random.Random(seed)
    residuals = CandidateSpace(spec).grid()["residual"]
    depths = [1, 2, 3, 4, 6, 8, 12, 16]
    widths = [64, 128, 192, 256, 384, 512]
    dist: dict[str, BaseDistribution] = {
        "residual": CategoricalDistribution(residuals),
        "n_layers": CategoricalDistribution(depths),
        "d_model": CategoricalDistribution(widths),
    }
    priced: dict[tuple[Any, ...], dict[str, float]] = {}
    trials = []
    for _ in range(n):
        residual, n_layers, d_model = rng.choice(residuals), rng.choice(depths), rng.choice(widths)
        decoded = decode_residual(residual)
        variant = decoded["variant"]
        arch = ArchConfig(
            n_layers=n_layers,
            d_model=d_model,
            n_heads=d_model // 64,
            variant=variant,
            block_size=decoded.get("block_size"),
        )
        key = (residual, n_layers, d_model)
        if key not in priced:
            priced[key] = {k: float(v) for k, v in price(arch).metrics().items()}
        costs = priced[key]
        shift = 0.0 if variant == "baseline" else -0.02
        loss = 2.0 + shift + 0.03 * (math.log(d_model / n_layers) - math.log(optimum)) ** 2
        loss += rng.gauss(0, 0.005)
        values = [loss if m == "val_loss" else costs[m] for m in spec.objectives]
        trials.append(
            create_trial(
                state=TrialState.COMPLETE,
                params={"residual": residual, "n_layers": n_layers, "d_model": d_model},
                distributions=dist,
                values=values,
                user_attrs={
                    "arch": arch.to_dict(),
                    "costs": costs,
                    "outcome": "completed",
                    "train": [{"final_val_loss": loss, "flops_spent": 1e12, "tokens_seen": 1000}],
                    "curve": [[10, 1000, 1e12, loss + 0.1], [20, 2000, 2e12, loss]],
                },
            )
        )
    return trials


def store_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """`trials` (finished, as `create_trial` makes them) added to `study` in bulk
    (`nas_service.store.trial_tables.add_finished_trials`)."""
    add_finished_trials(study, trials)


PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def temp_postgres() -> tuple[str, Callable[[], None]]:
    """A fresh database on the local PostgreSQL server: its URL and a function dropping it."""
    from sqlalchemy import create_engine, text

    name = f"ds_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop
