"""The runner's Ray connection: start a local Ray or join a configured cluster, with its
authentication; keep the service's secrets out of the workers; what the cluster can run.

Workers are stateless compute. A local Ray's workers inherit the environment of the process
that started Ray, so the runner starts it without the service's own settings in the
environment (`DEPTHSCOPE_*`: the database URL with its password, the API token, cluster
tokens). A remote cluster's workers have their own environment; nothing of the runner's is
sent to them but the code (`ship_code`).

`ray.init` has a deadline (`connect_ray`'s `timeout_s`, the setting `ray_connect_timeout_s`):
it runs in a thread of its own while this process's main thread waits, so a Ray that never
answers (a dead head, another process on its port) neither holds the runner past the
deadline (it raises `RayUnavailable`, and the runner exits with the reason) nor keeps
SIGTERM from reaching the runner's handler meanwhile (signals run in the main thread, which a
`ray.init` blocked in C++ would hold for a minute). A local cluster is always a Ray of the
runner's own (`address="local"`): never another Ray found on the machine (`RAY_ADDRESS`,
the last `ray start`), which may not answer, or may be somebody else's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nas_service.settings import ClusterSettings

log = logging.getLogger(__name__)

#: Environment variables no worker may see (prefixes).
SECRET_PREFIXES = ("DEPTHSCOPE_",)
SECRET_NAMES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "PGPASSWORD", "DATABASE_URL")


@contextlib.contextmanager
def scrubbed_environment() -> Iterator[None]:
    """Remove the service's secrets from `os.environ` for the duration (the processes a
    local `ray.init` starts are spawned now and keep this environment); restore them after."""
    removed = {
        k: v for k, v in os.environ.items() if k.startswith(SECRET_PREFIXES) or k in SECRET_NAMES
    }
    for k in removed:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(removed)


class RayUnavailable(RuntimeError):
    """The runner's Ray did not answer within the deadline (or failed to start)."""


def connect_ray(cluster: ClusterSettings, timeout_s: float = 60.0) -> bool:
    """Start a local Ray (address None) or join the configured cluster, with its auth. True
    when this call connected (the caller then owns the connection and shuts it down); False
    when Ray was connected already.

    Ray reads its authentication settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN) when it is
    imported, so they are exported before the import; if Ray was imported already, its
    cached token state is reset. `ray.init` must return within `timeout_s`, else
    `RayUnavailable` (see the module's docstring)."""
    already = "ray" in sys.modules
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cluster.address is not None:
        if cluster.auth_mode is not None:
            os.environ["RAY_AUTH_MODE"] = cluster.auth_mode
        if cluster.auth_token is not None:
            os.environ["RAY_AUTH_TOKEN"] = cluster.auth_token.get_secret_value()
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    import ray

    if ray.is_initialized():
        return False
    if already and (cluster.auth_mode is not None or cluster.auth_token is not None):
        try:
            from ray._raylet import (  # type: ignore[attr-defined]  # not in ray's stubs
                AuthenticationTokenLoader,
                Config,
            )

            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()
        except (ImportError, AttributeError):  # another Ray version: the import-time state
            log.warning("could not refresh Ray's authentication state after import")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if cluster.address is None:
        with scrubbed_environment(), own_sigterm():
            _with_deadline(
                lambda: ray.init(address="local", num_cpus=cluster.num_cpus, **kwargs),
                timeout_s,
                "the local Ray",
            )
        return True
    runtime_env = None
    if cluster.ship_code:
        import cost_model
        import workers

        runtime_env = {
            "py_modules": [
                str(Path(cost_model.__file__).parent),
                str(Path(workers.__file__).parent),
            ]
        }
    with own_sigterm():
        _with_deadline(
            lambda: ray.init(address=cluster.address, runtime_env=runtime_env, **kwargs),
            timeout_s,
            "the cluster's Ray head",
        )
    return True


#: `ray.init` threads that have not returned yet (`ray_init_pending`).
_pending: set[threading.Thread] = set()
#: Set once Ray is shut down: the thread that started a local Ray waits for it, because Ray
#: starts its processes with PR_SET_PDEATHSIG, which Linux fires when the *thread* that
#: started them ends: with the thread gone, its GCS and raylet would be killed.
_released = threading.Event()


def ray_init_pending() -> bool:
    """Whether a `ray.init` is still stuck in its thread (the process should exit without
    Ray's exit hooks, which would wait for it)."""
    return any(t.is_alive() for t in _pending)


def _with_deadline(init: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Run `init` (`ray.init`) in a daemon thread; the calling thread waits in short steps
    (so its signal handlers run) for at most `timeout_s`. On the deadline the processes this
    process started meanwhile (a local Ray's) are killed and `RayUnavailable` is raised; the
    thread is left behind (the runner exits). A thread whose `init` returned stays alive
    until `shutdown_ray` (see `_released`)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            init()
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)
            _pending.discard(threading.current_thread())
            return
        _pending.discard(threading.current_thread())
        _released.wait()  # keeps Ray's processes alive (their parent-death signal)

    before = _own_children()
    _released.clear()
    thread = threading.Thread(target=target, name="ray-init", daemon=True)
    _pending.add(thread)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread in _pending and thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
    if thread in _pending and thread.is_alive():
        _kill_new_children(before)
        raise RayUnavailable(f"{what} did not answer within {timeout_s:g} s")
    if failure:
        raise RayUnavailable(f"{what} could not be reached: {failure[0]}") from failure[0]


def _own_children() -> set[int]:
    try:
        import psutil

        return {p.pid for p in psutil.Process().children(recursive=True)}
    except Exception:  # psutil (Ray's copy) missing: nothing to clean up by pid
        return set()


def _kill_new_children(before: set[int]) -> None:
    """SIGKILL this process's descendants not in `before` (what a stuck `ray.init` started);
    psutil checks each pid still names the process it listed."""
    try:
        import psutil

        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=5)
    except ImportError:
        return


@contextlib.contextmanager
def own_sigterm() -> Iterator[None]:
    """Keep this process's SIGTERM handler across `ray.init`, which replaces it twice: with
    a Python handler of its own and, in the driver's core worker, a C-level one that dumps
    the stack and raises the signal again. Racing that, a runner told to stop sometimes
    died without its `finally` (the lease kept, its Ray left running). Setting the handler
    again installs it at the C level too (for SIGTERM only; Ray keeps its crash handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:  # None: installed outside Python, nothing to restore
            signal.signal(signal.SIGTERM, previous)


def shutdown_ray(local: bool) -> None:
    """Disconnect from Ray; for a local Ray this process started, make sure every process it
    started is gone. (Ray's agents watch for their raylet and exit on their own, but on a busy
    machine that took over a minute: they are stopped here, from a list of this process's
    own descendants taken before the shutdown, never by name.)"""
    import ray

    tree: list[psutil.Process] = []
    if local:
        import psutil

        tree = psutil.Process().children(recursive=True)
    ray.shutdown()
    _released.set()  # the thread that started it may end now
    if not tree:
        return
    import psutil

    _, alive = psutil.wait_procs(tree, timeout=5)
    for proc in alive:
        try:
            proc.kill()  # psutil checks the pid still names the process it listed
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)


def largest_node() -> dict[str, float]:
    """The resources of the largest alive node (CPU, GPU): what one trial can ask for."""
    import ray

    best: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if not node.get("Alive", False):
            continue
        res = node.get("Resources", {})
        if res.get("CPU", 0.0) > best["CPU"]:
            best = {"CPU": float(res.get("CPU", 0.0)), "GPU": float(res.get("GPU", 0.0))}
    return best


def retryable(exc: BaseException) -> bool:
    """Lost workers and nodes are retried; an exception raised by the training code is not."""
    import ray.exceptions as rex

    lost = (
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.ObjectLostError,
        rex.OwnerDiedError,
        rex.RaySystemError,
    )
    return isinstance(exc, lost) and not isinstance(exc, rex.RayTaskError)
