"""Where the runner's training runs execute: the `Backend` protocol and `RayBackend`.

The runner (`nas_service.runner.loop`) decides what to train and records everything in the
database; a backend only starts runs, says which have something to hand back, hands back
their `EvalPoint`s and `TrainResult`, and stops them. `RayBackend` runs each on a Ray
cluster as a streaming task (`workers.task.train_streaming`); the simulated backend
(`nas_service.runner.simulated`) replays a recorded landscape on a simulated clock, so the same
runner, sampler, pruner, fidelity logic and database can be measured at a scale no test
machine has. Real runs always go through Ray.
"""

from __future__ import annotations

from typing import Any, Protocol

from nas_service.runner.cluster import connect_ray, largest_node, retryable, shutdown_ray
from nas_service.settings import ClusterSettings
from workers.contract import EvalPoint, TrainResult, TrainSpec

Item = EvalPoint | TrainResult | BaseException


class Backend(Protocol):
    """Runs a runner's training runs. Handles are opaque to the runner."""

    def connect(self) -> bool:
        """Make the backend usable; True if it started something `shutdown` must stop."""

    def shutdown(self) -> None:
        """Stop what `connect` started."""

    def largest_node(self) -> dict[str, float]:
        """The resources one run can ask for at most: {"CPU": n, "GPU": m}."""

    def launch(self, spec: TrainSpec) -> Any:
        """Start one training run; returns its handle."""

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        """The handles with an item ready (at least one unless `timeout_s` passed)."""

    def next_item(self, handle: Any) -> Item:
        """The next item of a ready handle: an `EvalPoint`, the final `TrainResult`, or the
        exception that ended the run (a lost worker, an error of the training code)."""

    def cancel(self, handle: Any) -> None:
        """Stop a run (a finished or lost one: nothing happens)."""

    def retryable(self, exc: BaseException) -> bool:
        """Whether a run that ended with `exc` lost its worker (tried again) rather than
        failed in the training code (not)."""


class RayBackend:
    """Runs on a Ray cluster: a local Ray started by `connect` (address None), or the
    configured one. Each run is a streaming task asking for `spec.threads` CPUs (1 by
    default) and a GPU when the cluster has one."""

    def __init__(self, cluster: ClusterSettings, connect_timeout_s: float = 60.0) -> None:
        self.cluster = cluster
        self.connect_timeout_s = connect_timeout_s
        self._owns = False

    def connect(self) -> bool:
        self._owns = connect_ray(self.cluster, self.connect_timeout_s)
        return self._owns

    def shutdown(self) -> None:
        if self._owns:  # a local Ray's processes (its agents included) go with it
            shutdown_ray(local=self.cluster.address is None)
            self._owns = False

    def largest_node(self) -> dict[str, float]:
        return largest_node()

    def launch(self, spec: TrainSpec) -> Any:
        import ray

        from workers.task import train_streaming

        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        gpus = 1 if resources.get("GPU", 0) >= 1 else 0
        cpus = spec.threads or 1
        return train_streaming.options(num_cpus=cpus, num_gpus=gpus).remote(spec)

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        import ray

        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout_s)
        return list(ready)

    def next_item(self, handle: Any) -> Item:
        import ray

        try:
            item: Item = ray.get(next(handle))
        except StopIteration:
            item = RuntimeError("the training task ended without a result")
        except Exception as exc:
            item = exc
        return item

    def cancel(self, handle: Any) -> None:
        import ray

        ray.cancel(handle, force=True)

    def retryable(self, exc: BaseException) -> bool:
        return retryable(exc)
