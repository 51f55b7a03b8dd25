"""The runner processes a service starts (`depthscope serve`): one per named cluster, each
`python -m nas_service.runner --cluster NAME --forever --watch-parent` on the service's
database, restarted when it dies (it resumes its jobs: `Runner.recover`), and stopped with
the service (SIGTERM, then SIGKILL after `stop_timeout_s`). A runner started so also stops
by itself when the service dies, however it dies (`--watch-parent`)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Sequence

log = logging.getLogger(__name__)


class Supervisor:
    """The runner processes of `clusters` on the database at `database_url`; `processes`
    maps each cluster to its current process (health reads it)."""

    def __init__(
        self,
        database_url: str,
        clusters: Sequence[str],
        check_s: float = 5.0,
        stop_timeout_s: float = 30.0,
    ):
        self.database_url = database_url
        self.clusters = tuple(clusters)
        self.check_s = check_s
        self.stop_timeout_s = stop_timeout_s
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._task: asyncio.Task[None] | None = None

    def _start(self, name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nas_service.runner",
                "--cluster",
                name,
                "--forever",
                "--watch-parent",  # it stops when this service dies, however it dies
            ],
            env=os.environ | {"DEPTHSCOPE_DATABASE_URL": self.database_url},
        )

    def start(self) -> None:
        """Start a runner per cluster, and (in a running event loop) the task that restarts
        one that died."""
        for name in self.clusters:
            self.processes[name] = self._start(name)
        if self.clusters:
            self._task = asyncio.create_task(self._supervise())

    def restart_dead(self) -> None:
        """Restart every runner that exited; it resumes its jobs."""
        for name, proc in list(self.processes.items()):
            if proc.poll() is not None:
                log.warning("runner for %s exited with %s; restarting", name, proc.returncode)
                self.processes[name] = self._start(name)

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            self.restart_dead()

    def stop(self) -> None:
        """Stop supervising, then every runner: SIGTERM (it gives its lease back), SIGKILL
        after `stop_timeout_s`."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for proc in self.processes.values():
            proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
