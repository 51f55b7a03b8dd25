"""The real service for the benchmarks that load it: `Service` runs `depthscope serve` (its
runner, a local Ray) on loopback in a process session of its own and stops exactly its
processes; `RawHTTP` is a minimal keep-alive client to poll it with."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:  # Ray ships a copy and puts it on sys.path when imported
        importlib.import_module("ray")
        import psutil
    return psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the service, in its own session ------------------------------------------------------


class Service:
    def __init__(self, db_url: str, max_jobs: int, workdir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPTHSCOPE_", "RAY_"))}
        env |= {
            "DEPTHSCOPE_DATABASE_URL": db_url,
            "DEPTHSCOPE_MAX_CONCURRENT_JOBS": str(max_jobs),
            "DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS": "2",
            "DEPTHSCOPE_RUNNER_LEASE_S": "3",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nas_service.cli", "serve", "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/v1/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the service did not become healthy; see {self.log_path}")

    def stop(self, grace: float = 40.0) -> int:
        """SIGTERM the service (it stops its runner, which shuts its Ray down), wait, then
        SIGKILL what is left of its group and of its tree (a snapshot taken first). Returns
        how many processes were left to SIGKILL."""
        psutil = _psutil()
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        _, alive = psutil.wait_procs(tree, timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return len(alive)


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: one connection, one request
    at a time (a browser tab polling). httpx's async client costs a few milliseconds of CPU
    per request; fifty of them in one process on these cores measured mostly their own
    event loop's queue (a separate one-request-at-a-time probe saw a tenth of the p95)."""

    def __init__(self, base: str) -> None:
        host_port = base.removeprefix("http://")
        self.host, _, port = host_port.partition(":")
        self.port = int(port or 80)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> int:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        request = f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAccept: */*\r\n\r\n"
        self.writer.write(request.encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
        }
        if "content-length" in headers:
            await self.reader.readexactly(int(headers["content-length"]))
        else:  # chunked (the service sends Content-Length; kept for completeness)
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        if headers.get("connection") == "close":
            self.writer.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
