"""Optuna's own samplers and pruners replayed by the benchmark itself over a recorded
landscape, with the accounting of `bench/search_efficiency.py` (its peers, side by side).

Each peer search is an Optuna study driven directly here (ask/tell), not by depthscope's
runner: a trial picks a point of the same space (the landscape's shapes × `lr` ×
`depth_lr_mult`, as categorical choices), the benchmark launches the very training spec the
runner launched for that point in the reference grid on a fresh `SimulatedBackend` (the same
nearest-recorded-point lookup, curves, FLOPs and clock), reports each evaluation to the trial
at its index (equal fractions of the budget: evaluation k of the run's n), and cancels the
run when the pruner says so. Compute is the backend's: the FLOPs trained, partial runs
included. One run at a time (the depthscope rows of the published table use one worker too).

Peers: samplers `grid` (Optuna's `GridSampler`, random order per seed), `random`, `tpe`
(`TPESampler(multivariate=True)`), `nsga2`; pruners `sha` (`SuccessiveHalvingPruner()`,
Optuna's defaults), `hyperband` (`HyperbandPruner()`, its defaults), `none`. Two objectives:
no pruner (Optuna's pruners refuse several objectives).
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
from pathlib import Path
from typing import Any

PEER_SAMPLERS = ("grid", "random", "tpe", "nsga2")
PEER_PRUNERS = ("sha", "hyperband", "none")


def point_key(identity: dict[str, Any]) -> tuple[str, float, float]:
    """A point of the benchmark's space from a run's identity: shape, lr, depth_lr_mult."""
    shape = (
        f"{identity['variant']}/{identity.get('block_size')}/"
        f"{identity['n_layers']}/{identity['d_model']}"
    )
    return shape, float(identity["lr"]), float(identity["depth_lr_mult"])


def _sampler(name: str, seed: int, space: dict[str, list[Any]]) -> Any:
    import optuna

    if name == "grid":

        class Grid(optuna.samplers.GridSampler):
            """Optuna's grid, without its `study.stop()` once exhausted (that only works
            inside `optimize`; the benchmark drives the study by ask/tell and stops at the
            grid's size itself)."""

            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                return None

        return Grid(space, seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True)


def _pruner(name: str) -> Any:
    import optuna

    if name == "sha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


def run_peer(
    landscape: Any,
    specs: dict[tuple[str, float, float], Any],
    sampler: str,
    pruner: str,
    objectives: str,
    seed: int,
    n_trials: int,
    memory: dict[int, float],
    stop: Any,
) -> Any:
    """One peer search; returns its `SimulatedBackend` (its event log and compute).
    `stop(events, compute)` is asked after each run ends: True ends the search."""
    import optuna
    from optuna.trial import TrialState

    from nas_service.runner.simulated import SimulatedBackend
    from workers.contract import EvalPoint, TrainResult

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    shapes = sorted({k[0] for k in specs})
    lrs = sorted({k[1] for k in specs})
    mults = sorted({k[2] for k in specs})
    space: dict[str, list[Any]] = {"shape": shapes, "lr": lrs, "depth_lr_mult": mults}
    pareto = objectives == "pareto"
    study = optuna.create_study(
        directions=["minimize", "minimize"] if pareto else ["minimize"],
        sampler=_sampler(sampler, seed, space),
        pruner=_pruner("none" if pareto else pruner),
    )
    backend = SimulatedBackend(landscape, workers=1)
    for _ in range(n_trials):
        trial = study.ask()
        key = (
            trial.suggest_categorical("shape", shapes),
            trial.suggest_categorical("lr", lrs),
            trial.suggest_categorical("depth_lr_mult", mults),
        )
        handle = backend.launch(specs[key])
        n_evals = sum(isinstance(item, EvalPoint) for _, item in handle.items)
        k, outcome = 0, None
        while outcome is None:
            backend.wait([handle], 60.0)
            item = backend.next_item(handle)
            if isinstance(item, EvalPoint):
                k += 1
                if not pareto and k < n_evals and math.isfinite(item.val_loss):
                    trial.report(item.val_loss, k)
                    if trial.should_prune():
                        backend.cancel(handle)
                        outcome = "pruned"
            elif isinstance(item, TrainResult):
                loss = item.final_val_loss
                if not math.isfinite(loss):
                    outcome = "failed"
                else:
                    outcome = "done"
                    trial_no = handle.identity.get("trial")
                    values: Any = [loss, memory.get(trial_no, 0.0)] if pareto else loss
            else:
                outcome = "failed"
        if outcome == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        elif outcome == "failed":
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, values)
        if stop(backend.events, backend.compute_spent):
            break
    return backend


#: Where a bench-only install of Syne Tune lives (git-ignored; never a project dependency):
#: `pip install --target .bench-peers --no-deps syne-tune==0.16.0 dill` (and, for BOHB's KDE
#: searcher, `statsmodels patsy scipy pandas`).
SYNE_PATH = Path(__file__).resolve().parents[1] / ".bench-peers"
SYNE_SCHEDULERS = ("asha", "bohb", "moasha")
#: The objectives each Syne Tune scheduler searches: MOASHA the two (loss, memory), the rest loss.
SYNE_OBJECTIVES = {"asha": "loss", "bohb": "loss", "moasha": "pareto"}


def syne_tune(scheduler: str) -> str | None:
    """None when Syne Tune's `scheduler` can run here, else why not (the peer is skipped)."""
    if SYNE_PATH.is_dir() and str(SYNE_PATH) not in sys.path:
        sys.path.append(str(SYNE_PATH))
    try:
        baselines = importlib.import_module("syne_tune.optimizer.baselines")
        if scheduler == "bohb":  # its KDE searcher needs statsmodels and scipy
            importlib.import_module("syne_tune.optimizer.schedulers.searchers.kde.kde_searcher")
        if scheduler == "moasha":
            importlib.import_module("syne_tune.optimizer.schedulers.multiobjective.moasha")
        else:
            getattr(baselines, scheduler.upper())
    except Exception as exc:  # any import failure: the peer is skipped, said so
        return f"Syne Tune {scheduler.upper()} is not importable ({type(exc).__name__}: {exc})"
    return None


def run_syne(
    landscape: Any,
    specs: dict[tuple[str, float, float], Any],
    scheduler: str,
    seed: int,
    n_trials: int,
    stop: Any,
    memory: dict[int, float] | None = None,
) -> Any:
    """One Syne Tune search (ASHA or BOHB from `syne_tune.optimizer.baselines`, or MOASHA over
    val_loss and train_memory_bytes; their defaults: grace period 1, η = 3, one bracket;
    random search, KDE resp. non-dominated sorting under it), driven here one trial at a
    time: each evaluation is a result at `epoch` k of the run's n (`max_t` = n), a STOP
    cancels the run. MOASHA runs as shipped: 0.16's `NonDominatedPriority` returns a sort
    order that `Bracket.on_result` reads as one priority per result, so it mis-ranks the
    results it keeps. Returns the `SimulatedBackend`."""
    from datetime import datetime

    syne_tune(scheduler)  # its path on sys.path
    logging.getLogger("syne_tune").setLevel(logging.ERROR)
    Trial = importlib.import_module("syne_tune.backend.trial_status").Trial
    choice = importlib.import_module("syne_tune.config_space").choice
    baselines = importlib.import_module("syne_tune.optimizer.baselines")
    stop_decision = importlib.import_module("syne_tune.optimizer.scheduler").SchedulerDecision.STOP

    from nas_service.runner.simulated import SimulatedBackend
    from workers.contract import EvalPoint, TrainResult

    shapes = sorted({k[0] for k in specs})
    lrs = sorted({k[1] for k in specs})
    mults = sorted({k[2] for k in specs})
    first = next(iter(specs.values()))
    probe = SimulatedBackend(landscape, workers=1).launch(first)
    n_evals = sum(isinstance(item, EvalPoint) for _, item in probe.items)
    space = {"shape": choice(shapes), "lr": choice(lrs), "depth_lr_mult": choice(mults)}
    both = scheduler == "moasha"
    if both:
        moasha = importlib.import_module("syne_tune.optimizer.schedulers.multiobjective.moasha")
        sched = moasha.MOASHA(
            config_space=space,
            metrics=["val_loss", "train_memory_bytes"],
            time_attr="epoch",
            max_t=n_evals,
            do_minimize=True,
            random_seed=seed,
        )
    else:
        sched = getattr(baselines, scheduler.upper())(
            config_space=space,
            metric="val_loss",
            time_attr="epoch",
            max_t=n_evals,
            do_minimize=True,
            random_seed=seed,
        )
    backend = SimulatedBackend(landscape, workers=1)
    for number in range(n_trials):
        suggestion = sched.suggest()
        if suggestion is None or suggestion.config is None:
            break
        config = suggestion.config
        trial = Trial(trial_id=number, config=config, creation_time=datetime.now())
        sched.on_trial_add(trial)
        key = (config["shape"], float(config["lr"]), float(config["depth_lr_mult"]))
        handle = backend.launch(specs[key])
        extra = {"train_memory_bytes": (memory or {}).get(handle.identity.get("trial"), 0.0)}
        k, result = 0, None
        while True:
            backend.wait([handle], 60.0)
            item = backend.next_item(handle)
            if isinstance(item, EvalPoint):
                k += 1
                result = {"val_loss": item.val_loss, "epoch": k} | (extra if both else {})
                if k < n_evals and sched.on_trial_result(trial, result) == stop_decision:
                    backend.cancel(handle)
                    sched.on_trial_remove(trial)
                    break
            elif isinstance(item, TrainResult) and math.isfinite(item.final_val_loss):
                final = {"val_loss": item.final_val_loss, "epoch": k} | (extra if both else {})
                sched.on_trial_complete(trial, final)
                break
            else:
                sched.on_trial_error(trial)
                break
        if stop(backend.events, backend.compute_spent):
            break
    return backend
