"""The Python client (`nas_service.Client`) against the real service on loopback
(`depthscope serve` in a process of its own): the token, typed answers parsed into the API's
schemas with `to_pandas()`, refusals as exceptions naming the field, a PostgreSQL outage
retried with bounded back-off, a job followed to its end; and the command line sending
through the same transport."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nas_service import Client, ClientError, Job, ServiceUnavailable
from nas_service.api.schemas import (
    CalibrationRead,
    CompareRead,
    JobRead,
    LandscapeRead,
    OptimumRead,
    ParetoRead,
    SensitivityRead,
    TrialRead,
)
from tests.support.api import ROOT, SPEC, _free_port, _synthetic, cli
from tests.support.postgres import PrivatePostgres

TOKEN = "s3cret"
METRICS = ["val_loss", "train_memory_bytes"]
N_TRIALS = 60


def _serve(db_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`depthscope serve --no-runner` (the API alone) with a token, on a free port."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPTHSCOPE_", "RAY_"))}
    env |= {"DEPTHSCOPE_API_TOKEN": TOKEN, "DEPTHSCOPE_RESULTS_FRESH_S": "0"}
    argv = ["serve", "--no-runner", "--port", str(port), "--database-url", db_url]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nas_service.cli", *argv],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            from tests.support.procs import terminate_session

            terminate_session(proc, grace=10)
            pytest.fail("the service did not come up: " + log.read_text()[-2000:])
        time.sleep(0.3)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    from tests.support.procs import terminate_session

    terminate_session(proc, grace=30)


def _seed(client: Client, db_url: str, n: int = N_TRIALS) -> Job:
    """A job submitted through the client, its study given `n` synthetic finished trials
    (no runner: nothing trains), as the read-path tests do."""
    import optuna

    from nas_service.spec import parse_spec
    from nas_service.store.jobs import optuna_storage

    spec = SPEC | {"name": "client", "objectives": METRICS, "n_trials": 200}
    job = client.submit(spec)
    assert job.last is not None
    study = optuna.load_study(study_name=job.last.study_name, storage=optuna_storage(db_url))
    support: Any = _synthetic()
    study.add_trials(support.synthetic_trials(parse_spec(spec), n))
    return job


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The API alone over a fresh SQLite file, with a token: (its URL, the database URL)."""
    folder = tmp_path_factory.mktemp("client")
    db_url = f"sqlite:///{folder / 'client.db'}"
    proc, url = _serve(db_url, folder / "server.log")
    try:
        yield url, db_url
    finally:
        _stop(proc)


@pytest.fixture
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEPTHSCOPE_API_TOKEN", raising=False)
    monkeypatch.delenv("DEPTHSCOPE_URL", raising=False)


def test_importing_the_client_loads_no_torch_or_ray() -> None:
    code = (
        "import sys\n"
        "from nas_service import Client\n"
        "Client('http://127.0.0.1:9').close()\n"
        "light = [m for m in ('torch', 'ray', 'sqlalchemy', 'fastapi', 'numpy') "
        "if m in sys.modules]\n"
        "import nas_service.client.results\n"
        "print(','.join(light), ','.join(m for m in ('torch', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == [], out.stdout  # nothing heavy, even with the typed answers


def test_the_token_is_required_and_sent(
    api: tuple[str, str], no_env_token: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = api
    with Client(url) as anonymous, pytest.raises(ClientError) as refused:
        anonymous.jobs()
    assert refused.value.status == 401 and "token" in refused.value.message.lower()
    with Client(url, token="wrong") as wrong, pytest.raises(ClientError) as refused:
        wrong.jobs()
    assert refused.value.status == 401
    with Client(url, token=TOKEN) as client:
        assert client.jobs().total >= 0
    monkeypatch.setenv("DEPTHSCOPE_API_TOKEN", TOKEN)
    monkeypatch.setenv("DEPTHSCOPE_URL", url)
    with Client() as client:  # both from the environment
        assert client.url == url and client.jobs().total >= 0


def test_the_answers_are_the_apis_schemas(api: tuple[str, str], no_env_token: None) -> None:
    url, db_url = api
    with Client(url, token=TOKEN) as client:
        job = _seed(client, db_url)
        read = job.read()
        assert isinstance(read, JobRead) and read.id == job.id
        assert read.progress.completed == N_TRIALS and job.status.value == "pending"
        assert client.job(job.id).last == read

        trials = job.trials(page=7)  # every page, 7 at a time
        assert trials.total == N_TRIALS and len(trials.items) == N_TRIALS
        assert all(isinstance(t, TrialRead) for t in trials.items)
        assert sorted(t.number for t in trials.items) == list(range(N_TRIALS))
        assert len(job.trials(limit=10, page=4).items) == 10
        baseline = job.trials(variant="baseline")
        assert 0 < baseline.total < N_TRIALS
        assert {t.variant for t in baseline.items} == {"baseline"}
        table = trials.to_pandas()
        assert len(table) == N_TRIALS and list(table.columns[:5]) == [
            "number",
            "state",
            "outcome",
            "reason",
            "variant",
        ]
        losses = {t.number: float(t.metrics["val_loss"] or "nan") for t in trials.items}
        assert dict(zip(table["number"], table["metric.val_loss"], strict=True)) == losses

        front = job.pareto(METRICS)
        assert isinstance(front, ParetoRead) and front.metrics == METRICS and front.front
        frame = front.to_pandas()
        assert list(frame["number"]) == [t.number for t in front.front]
        assert min(frame["metric.val_loss"]) == pytest.approx(min(losses.values()))

        optimum = job.optimum(bootstrap=20)
        assert isinstance(optimum, OptimumRead)
        fits = optimum.to_pandas().set_index("variant")
        assert fits.loc["baseline", "verdict"] == "ok"
        assert fits.loc["baseline", "optimum_ratio"] == pytest.approx(40.0, rel=0.25)

        comparison = job.compare("baseline")
        assert isinstance(comparison, CompareRead) and comparison.reference == "baseline"
        assert len(comparison.to_pandas()) == len(comparison.pairs)
        sensitivity = job.sensitivity()
        assert isinstance(sensitivity, SensitivityRead)
        assert list(sensitivity.to_pandas().columns)[:2] == ["variant", "axis"]
        landscape = job.landscape()
        assert isinstance(landscape, LandscapeRead) and len(landscape.trials) == N_TRIALS
        assert len(landscape.to_pandas()) == N_TRIALS
        assert job.plot("optimum").startswith(b"\x89PNG")
        calibration = job.calibration()
        assert isinstance(calibration, CalibrationRead) and calibration.scope == "job"
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still pending"):  # no runner: it never starts
            job.wait(progress=False, poll_s=0.1, timeout_s=0.5)
        assert time.monotonic() - started < 10
        assert job.cancel().status.value == "cancelled"
        with pytest.raises(ClientError) as again:
            job.cancel()
        assert again.value.status == 409 and again.value.field == "status"


def test_wait_draws_a_bar_on_a_terminal(api: tuple[str, str], no_env_token: None) -> None:
    """`wait(progress=True)` with stderr a terminal (a pseudo-terminal here): the bar, with
    the trials counted; the same call off a terminal prints nothing (the end-to-end test)."""
    import fcntl
    import pty
    import struct
    import termios

    url, db_url = api
    with Client(url, token=TOKEN) as client:
        job = _seed(client, db_url, n=5)
        job.cancel()  # finished: `wait` returns at its first read
    code = (
        "from nas_service import Client\n"
        f"with Client({url!r}, token={TOKEN!r}) as c:\n"
        f"    print(c.job({job.id!r}).wait(progress=True).status.value)\n"
    )
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=child
    )
    os.close(child)
    out, _ = proc.communicate(timeout=120)
    drawn = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main)
    assert proc.returncode == 0 and out.decode().strip() == "cancelled"
    assert b"trials=5/200" in drawn and b"run" in drawn, drawn


def test_a_refusal_names_the_field_and_stores_nothing(
    api: tuple[str, str], no_env_token: None, tmp_path: Path
) -> None:
    url, _ = api
    with Client(url, token=TOKEN) as client:
        before = client.jobs().total
        with pytest.raises(ClientError) as refused:
            client.submit(SPEC | {"name": "bad", "n_trials": 0})
        err = refused.value
        assert err.status == 422 and err.field == "n_trials" and "greater than" in err.message
        assert {"field": "n_trials", "message": err.errors[0]["message"]} in err.errors
        # a spec file is checked here first: refused naming the field, nothing sent
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(SPEC | {"colour": "blue"}))
        with pytest.raises(ClientError) as refused:
            client.submit(bad)
        assert refused.value.status is None and refused.value.field == "colour"
        assert client.jobs().total == before
        for job_id in ("no-such-job", "x?status=running", "%2e%2e", "../health", "a/b", ".."):
            with pytest.raises(ClientError) as refused:  # the id is one path segment
                client.job(job_id)
            assert refused.value.field == "job_id", job_id  # a 404, or refused before sending
            assert refused.value.status == (None if "/" in job_id or job_id == ".." else 404)
        job = client.submit(SPEC | {"name": "refusals"})
        with pytest.raises(ClientError) as refused:
            job.pareto(["val_loss"])
        assert refused.value.status == 422 and refused.value.field == "metrics"
        with pytest.raises(ClientError) as refused:
            job.compare(reference="nope")
        assert refused.value.status == 404 and refused.value.field == "reference"
        with pytest.raises(ClientError) as refused:
            job.plot("../../health")  # a plot the service has, or nothing sent
        assert refused.value.status is None and refused.value.field == "name"
        with pytest.raises(ValueError, match="poll_s"):
            job.wait(poll_s=0)
        job.cancel()
        with pytest.raises(ClientError) as not_json:  # the dashboard's page: HTML, not JSON
            client.request("GET", "/")
        assert not_json.value.status == 200 and "not JSON" in not_json.value.message
    with pytest.raises(ClientError) as closed:
        job.read()  # its client closed: a ClientError, not httpx's RuntimeError
    assert closed.value.status is None and "closed" in closed.value.message
    with Client("http://127.0.0.1:9", token=TOKEN) as nowhere, pytest.raises(ClientError) as down:
        nowhere.jobs()
    assert down.value.status is None and "cannot reach the service" in str(down.value)


def test_the_cli_sends_through_the_client(
    api: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The command line's HTTP commands use the client's transport: the token from the
    environment, the service's status and message on a refusal."""
    url, db_url = api
    monkeypatch.delenv("DEPTHSCOPE_API_TOKEN", raising=False)
    out = cli(url, "status")
    assert out.returncode == 1 and "error: 401:" in out.stderr
    monkeypatch.setenv("DEPTHSCOPE_API_TOKEN", TOKEN)
    with Client(url) as client:
        job = _seed(client, db_url, n=12)
        assert job.id in cli(url, "status").stdout
        out = cli(url, "pareto", job.id, "--metrics", "val_loss")
        assert out.returncode == 1 and "422:" in out.stderr and "metrics" in out.stderr
        out = cli(url, "trials", job.id)
        assert out.returncode == 0 and "12 of 12 trials" in out.stdout
        job.cancel()


@pytest.mark.postgres
@pytest.mark.slow
def test_a_database_outage_is_retried_then_bounded(
    private_pg: PrivatePostgres,
    tmp_path: Path,
    no_env_token: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL stopped under the API (503 with Retry-After): a call made during the
    outage is retried with back-off and answers once the database is back; an outage that
    outlasts the retries is `ServiceUnavailable` after exactly retries + 1 attempts."""
    db_url = private_pg.create_database()
    proc, url = _serve(db_url, tmp_path / "server.log")
    try:
        with Client(url, token=TOKEN) as client:
            job = _seed(client, db_url, n=12)
        private_pg.stop()
        timer = threading.Timer(3.0, private_pg.start)  # the database comes back, later
        try:
            raw = httpx.get(
                f"{url}/v1/jobs/{job.id}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            )
            assert raw.status_code == 503 and raw.headers["retry-after"], raw.text

            started = time.monotonic()
            with (
                Client(url, token=TOKEN, retries=2, backoff=0.1, max_delay=0.3) as short,
                caplog.at_level(logging.WARNING, logger="nas_service.client"),
                pytest.raises(ServiceUnavailable) as gave_up,
            ):
                short.job(job.id)
            assert gave_up.value.status == 503 and gave_up.value.field == "database"
            assert gave_up.value.attempts == 3
            retries = [r for r in caplog.records if "503" in r.getMessage()]
            assert len(retries) == 2, [r.getMessage() for r in caplog.records]
            assert time.monotonic() - started < 25  # bounded: no endless wait
            caplog.clear()

            timer.start()
            with (
                Client(url, token=TOKEN, retries=30, backoff=0.5, max_delay=1.0) as patient,
                caplog.at_level(logging.WARNING, logger="nas_service.client"),
            ):
                read = patient.job(job.id).read()
            timer.join()
            assert read.id == job.id and read.progress.completed == 12
            assert any("503" in r.getMessage() for r in caplog.records)  # it did wait
        finally:
            timer.cancel()
            if timer.is_alive():
                timer.join()
            private_pg.start()  # a no-op when it is up
    finally:
        _stop(proc)


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_a_job_followed_to_its_end(
    server: str, no_env_token: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`depthscope serve` with its runner: a job submitted through the client and followed
    by `wait` (quiet when stderr is no terminal) ends completed, its trials trained."""
    with Client(server) as client:
        job = client.submit(SPEC | {"name": "followed"})
        done = job.wait(progress=True, poll_s=0.5, timeout_s=400)
        assert done.status.value == "completed" and done.progress.counted == SPEC["n_trials"]
        assert capsys.readouterr().err == ""  # no bar off a terminal
        assert job.trials().total == SPEC["n_trials"]
    # `depthscope submit --wait` follows its job with the same `wait`
    from nas_service import cli as command_line

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC | {"name": "cli-followed"}))
    assert command_line.main(["submit", str(spec_file), "--wait", "--url", server]) == 0
    out = capsys.readouterr().out
    assert "submitted job" in out and out.rstrip().endswith(": completed"), out
    # the README's example script, on the same small job
    import importlib.util

    path = ROOT / "examples" / "client_quick.py"
    loader = importlib.util.spec_from_file_location("client_quick", path)
    assert loader is not None and loader.loader is not None
    example = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(example)
    assert example.main(server, spec_file) == 0
    out = capsys.readouterr().out
    assert ": completed, 4 trials" in out and "optimum_ratio" in out and "verdict" in out, out


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from nas_service.client.results import Trials

    empty = Trials(items=[], total=0, limit=0, offset=0)
    assert list(empty.to_pandas().columns)[:2] == ["number", "state"]  # empty, still the columns
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if not installed
    with pytest.raises(ImportError, match=r"depthscope\[pandas\]"):
        empty.to_pandas()
