"""Helpers of the runner tests: settings and sessions on a fresh database, a job's study,
its counted trials."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from nas_service.settings import ClusterSettings, get_settings
from nas_service.store import Job, make_engine, make_sessionmaker, upgrade
from nas_service.store.jobs import optuna_storage
from nas_service.store.records import TrialAttr

#: The service tests' tiny job: two depths, two widths, baseline and Block AttnRes (S = 1),
#: trained in about a second per trial on the built-in corpus. Tests vary it with `|`.
TINY: dict[str, Any] = {
    "name": "tiny",
    "space": {
        "n_layers": [1, 2],
        "d_model": [32, 64],
        "head_dim": 16,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1],
    },
    "budget": {"tokens": 4 * 32 * 16},
    "objectives": ["val_loss"],
    "sampler": "random",
    "pruner": "none",
    "n_trials": 4,
    "max_concurrent": 2,
    "training": {"seq_len": 32, "batch_size": 4, "n_evals": 4, "eval_batches": 2, "threads": 1},
    "cost": {"hardware": "cpu"},
}


def setup(url: str, **settings: Any) -> tuple[Any, Any]:
    """Migrated database at `url`: the settings (a local cluster of 2 CPUs) and a sessionmaker."""
    upgrade(url)
    s = get_settings(database_url=url, clusters={"local": ClusterSettings(num_cpus=2)}, **settings)
    return s, make_sessionmaker(make_engine(url))


def study_of(url: str, job: Job) -> optuna.Study:
    return optuna.load_study(study_name=job.study_name, storage=optuna_storage(url))


def counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that count towards n_trials: finished, and not lost to a crash."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [t for t in study.get_trials(states=states) if not t.user_attrs.get(TrialAttr.LOST)]
