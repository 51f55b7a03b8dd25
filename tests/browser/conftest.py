"""Fixtures of the browser tests: the real service (`depthscope serve` on a free loopback
port, its runner and a local Ray, SQLite in a temporary folder, an API token; started in a
process session of its own and stopped by it, `tests.support.procs`), the system's
headless Chromium (Debian's `chromium`, driven by Playwright with its own driver: never
`playwright install`), and a page that records every console error and page error.

No browser installed is a failure, not a skip: CI runs these tests (`make setup` installs
chromium and chromium-driver where it may)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import ROOT, _free_port
from tests.support.procs import terminate_session

#: Where the tests leave their screenshots and figures (git-ignored).
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TOKEN = "browser-token"
#: Debian's package installs the browser here; `DEPTHSCOPE_CHROMIUM` names another.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str:
    named = os.environ.get("DEPTHSCOPE_CHROMIUM")
    for candidate in (named, *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        "no Chromium: the browser tests need Debian's chromium package "
        "(`make setup` installs it: apt-get install chromium chromium-driver)"
    )


@dataclass
class Service:
    url: str
    db_url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"} | kw.pop("headers", {})
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kw)


def start_service(folder: Path, runner: bool = True, **env: str) -> Service:
    """`depthscope serve` over a fresh SQLite file in `folder`, healthy, with the token."""
    port = _free_port()
    db_url = f"sqlite:///{folder / 'dashboard.db'}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DEPTHSCOPE_", "RAY_"))}
    environ |= {
        "DEPTHSCOPE_DATABASE_URL": db_url,
        "DEPTHSCOPE_API_TOKEN": TOKEN,
        "DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS": "2",
        "DEPTHSCOPE_RUNNER_LEASE_S": "3",
        "RAY_USAGE_STATS_ENABLED": "0",
        **env,
    }
    log = folder / "service.log"
    args = [sys.executable, "-m", "nas_service.cli", "serve", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, *([] if runner else ["--no-runner"])],
            cwd=ROOT,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    service = Service(f"http://127.0.0.1:{port}", db_url, proc, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{service.url}/v1/health", timeout=2).status_code == 200:
                return service
        time.sleep(0.3)
    terminate_session(proc)
    pytest.fail("the service did not come up: " + log.read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The service with its runner (jobs train on the built-in corpus)."""
    svc = start_service(tmp_path_factory.mktemp("dashboard"))
    try:
        yield svc
    finally:
        terminate_session(svc.proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Watched:
    """A page and what its console said: errors (console.error and the browser's own),
    uncaught exceptions; `allow` names the HTTP statuses a test provokes on purpose (the
    browser logs a failed response as "Failed to load resource: … status of 401")."""

    page: Any
    errors: list[str] = field(default_factory=list)
    allow: set[int] = field(default_factory=set)

    def unexpected(self) -> list[str]:
        allowed = tuple(f"the server responded with a status of {s}" for s in self.allow)
        return [e for e in self.errors if not any(a in e for a in allowed)]

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    w = Watched(page)
    page.on(
        "console", lambda m: w.errors.append(f"console: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda exc: w.errors.append(f"page error: {exc}"))
    try:
        yield w
    finally:
        context.close()
    assert w.unexpected() == [], w.errors


def login(w: Watched, service: Service, token: str = TOKEN) -> None:
    """Open the dashboard and enter the token at its prompt."""
    w.page.goto(service.url + "/")
    w.page.locator("#token-panel").wait_for(state="visible")
    w.page.fill("#token-input", token)
    w.page.click("#token-save")
