"""The Ray entry points of the workers: the only module of workers/ that imports ray.

Workers are stateless compute: a task receives a `TrainSpec`, trains it, and hands back
`EvalPoint`s while it trains and the `TrainResult` at the end. It never touches a database.
"""

from __future__ import annotations

from collections.abc import Iterator

import ray

from workers.contract import EvalPoint, TrainResult, TrainSpec
from workers.train import train, training_run


def stream_training(spec: TrainSpec) -> Iterator[EvalPoint | TrainResult]:
    """Every evaluation as it happens, then the result. The consumer stops a run early by
    cancelling the task (`ray.cancel`), having already received every point so far."""
    run = training_run(spec)
    try:
        point = next(run)
        while True:
            yield point
            point = run.send(False)
    except StopIteration as finished:
        yield finished.value


@ray.remote(num_returns="streaming", max_retries=0)
def train_streaming(spec: TrainSpec) -> Iterator[EvalPoint | TrainResult]:
    """Ray streaming-generator task: yields `EvalPoint`s, then one `TrainResult`."""
    yield from stream_training(spec)


@ray.remote(max_retries=0)
def train_task(spec: TrainSpec) -> TrainResult:
    """Ray task: train `spec` to the end and return its `TrainResult`."""
    return train(spec)
