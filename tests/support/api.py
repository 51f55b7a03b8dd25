"""What the API tests share: the small job every one submits (`SPEC`), the error-shape
assertion, a spec with one field changed, an app with a token, a free port, the synthetic
trials of bench/support.py, `depthscope serve` started and awaited (`serve`), and the CLI
against a server. The `client` and `server` fixtures are in conftest.py."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from tests.support.jobs import TINY

ROOT = Path(__file__).resolve().parents[2]


SPEC: dict[str, Any] = TINY | {
    "name": "api",
    "objectives": ["val_loss", "params"],
    "sampler": "grid",
    "training": TINY["training"] | {"n_evals": 2},
}


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["status"] == status and body["message"]
    return dict(body)


def bad_spec(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    node = spec
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return spec


def _token_app(tmp_path: Path) -> Any:
    return create_app(
        get_settings(database_url=f"sqlite:///{tmp_path / 't.db'}", api_token="s3cret")
    )


# -- end to end over real HTTP ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(url: str, *args: str, timeout: int = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nas_service.cli", *args, "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _synthetic() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_synthetic", ROOT / "bench" / "support.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(
    folder: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 90
) -> tuple[str, subprocess.Popen[bytes]]:
    """`depthscope serve` with `args` on a free port of loopback, in a session of its own
    (stop it with `procs.terminate_session`), its output in `folder/server.log`: its URL once
    `/v1/health` answers 200, and the process. The test fails, the server stopped, if it does
    not come up within `timeout_s`."""
    from tests.support.procs import terminate_session

    port = _free_port()
    log = folder / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nas_service.cli", "serve", "--port", str(port), *args],
            env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"} if env is None else env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.3)
    terminate_session(proc, grace=30)
    pytest.fail("the server did not come up: " + log.read_text()[-2000:])
