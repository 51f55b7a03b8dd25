"""A typed Python client of the depthscope service (`from nas_service import Client`).

    client = Client("http://127.0.0.1:8000", token="…")
    job = client.submit("examples/quick.yaml")  # a path, a mapping or a `JobSpec`
    job.wait(progress=True)                     # a bar on a terminal, quiet elsewhere
    front = job.pareto(["val_loss", "params"])  # a `ParetoRead` …
    front.to_pandas()                           # … as a table (pandas: the `pandas` extra)

Every answer is parsed into the API's own schemas (`nas_service.api.schemas`); the tabular
ones (`trials`, `pareto`, `optimum`, `compare`, `sensitivity`, `landscape`) are those
schemas with a `to_pandas()` added (`nas_service.client.results`). A refusal is a
`ClientError` carrying the status, the field and the reason the service gave; a database
outage (503 with `Retry-After`) is retried with exponential back-off, a bounded number of
times, then raised as `ServiceUnavailable`.

`Client.request` is the one HTTP transport: the `depthscope` command line sends through it
too. Importing this module imports the standard library only (httpx loads with the first
`Client`, the schemas with the first typed answer): never torch, Ray or the database layer.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from nas_service.api.health import HealthRead
    from nas_service.api.schemas import CalibrationRead, JobList, JobRead
    from nas_service.client.results import (
        Comparison,
        Landscape,
        Optimum,
        Pareto,
        Sensitivity,
        Trials,
    )
    from nas_service.spec import JobSpec
    from nas_service.store.tables import JobStatus

__all__ = ["DEFAULT_URL", "Client", "ClientError", "Job", "ServiceUnavailable"]

log = logging.getLogger(__name__)

#: The service when neither the `url` argument nor DEPTHSCOPE_URL names one.
DEFAULT_URL = "http://127.0.0.1:8000"
#: A job's states from which it moves no more.
FINISHED = ("completed", "failed", "cancelled")
#: The plots a job has (`GET /v1/jobs/{id}/plots/{name}.png`).
PLOTS = ("pareto", "optimum", "compare", "calibration")


class ClientError(Exception):
    """A request the service refused, or could not be sent: `status` (None when no answer
    came), the first offending `field`, the `message`, and every (field, message) in
    `errors`, as the API's error body gives them."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        field: str | None = None,
        errors: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status, self.field, self.message = status, field, message
        self.errors: list[dict[str, Any]] = [dict(e) for e in errors]


class ServiceUnavailable(ClientError):
    """The database stayed unreachable (503) through every retry; `attempts` made."""

    def __init__(self, message: str, field: str | None, attempts: int) -> None:
        super().__init__(message, 503, field)
        self.attempts = attempts


def _error(response: httpx.Response) -> ClientError:
    """The API's error body ({"error": {status, field, message, errors}}) as an exception;
    another body (a proxy's page, a degraded health report) is quoted."""
    try:
        detail = response.json()["error"]
        return ClientError(
            str(detail["message"]),
            response.status_code,
            detail.get("field"),
            detail.get("errors") or (),
        )
    except (ValueError, KeyError, TypeError):
        return ClientError(response.text[:500], response.status_code)


def _segment(job_id: str) -> str:
    """A job id as one path segment (`?`, `#`, `%` escaped), so it reaches `/v1/jobs/{id}`
    as given (the service refuses an unknown one with a 404 naming `job_id`) and never names
    another route; one with a `/` (or none at all) is refused here, naming `job_id`."""
    if not isinstance(job_id, str) or "/" in job_id or job_id.strip(".") == "":
        raise ClientError(
            f"not a job id: {job_id!r} (a job id is one path segment)", None, "job_id"
        )
    return urllib.parse.quote(job_id, safe="")


def _retry_after(response: httpx.Response) -> float | None:
    """The `Retry-After` seconds of a 503, or None (no header: not a transient outage)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return 0.0  # an HTTP date: retry on our own back-off
    return seconds if seconds >= 0 else 0.0


class Client:
    """The service at `url` (else DEPTHSCOPE_URL, else `DEFAULT_URL`), with the bearer
    `token` (else DEPTHSCOPE_API_TOKEN, else none).

    A 503 that carries `Retry-After` (the database unreachable) is retried up to `retries`
    times, waiting max(Retry-After, `backoff`·2^k) seconds, at most `max_delay`, before
    retry k; then `ServiceUnavailable`. Any other error status is a `ClientError` at once.
    Retrying a submission is safe: the service commits a job before it answers, so a 503
    means it was rolled back (only a connection lost during the commit itself leaves it
    unknown; `jobs()` shows whether it was stored). Use as a context manager, or `close()`,
    to release the connections."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 120.0,
        retries: int = 5,
        backoff: float = 1.0,
        max_delay: float = 30.0,
    ) -> None:
        import httpx

        if retries < 0 or backoff < 0 or max_delay < 0 or not timeout > 0:
            raise ValueError("retries, backoff and max_delay must be >= 0, timeout > 0")
        self.url = (url or os.environ.get("DEPTHSCOPE_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("DEPTHSCOPE_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries, self.backoff, self.max_delay = retries, backoff, max_delay
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- the transport ----------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call (`path` below the URL; `params`, `json`, … as httpx takes them): the
        decoded JSON, or the bytes of an image. Errors as the class says."""
        import httpx

        if self._http.is_closed:
            raise ClientError(f"the client of {self.url} is closed; make a new one")
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                raise ClientError(f"cannot reach the service at {self.url}: {exc}") from None
            wait = _retry_after(response) if response.status_code == 503 else None
            if wait is None:
                break
            if attempt >= self.retries:
                err = _error(response)
                raise ServiceUnavailable(
                    f"{err.message} (still after {attempt + 1} attempts)", err.field, attempt + 1
                )
            delay = min(self.max_delay, max(wait, self.backoff * 2**attempt))
            log.warning(
                "%s %s: 503 (%s); retry %d of %d in %.1fs",
                method,
                path,
                _error(response).message,
                attempt + 1,
                self.retries,
                delay,
            )
            time.sleep(delay)
            attempt += 1
        if response.status_code >= 400:
            raise _error(response)
        if response.headers.get("content-type", "").startswith("image/"):
            return response.content
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise ClientError(
                f"{method} {path}: the answer is not JSON ({kind}); is {self.url} the service?",
                response.status_code,
            ) from None

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec | Mapping[str, Any] | str | os.PathLike[str]) -> Job:
        """Submit a job: a spec file (YAML or JSON, checked here as the service checks it,
        so a bad file is refused naming the field before anything is sent), a mapping (the
        service checks it) or a `JobSpec`. Returns the stored, pending job."""
        from pydantic import BaseModel

        if isinstance(spec, str | os.PathLike):
            from nas_service.spec import SpecError, load_spec

            try:
                loaded = load_spec(Path(spec))
            except SpecError as exc:
                errors = [{"field": f, "message": m} for f, m in exc.errors]
                raise ClientError(str(exc), None, exc.field, errors) from None
            body: Any = loaded.model_dump(mode="json", exclude_unset=True)
        elif isinstance(spec, BaseModel):
            body = spec.model_dump(mode="json", exclude_unset=True)
        elif isinstance(spec, Mapping):
            body = dict(spec)
        else:
            raise TypeError(f"spec: a path, a mapping or a JobSpec, not {type(spec).__name__}")
        read = self._job_read(self.request("POST", "/v1/jobs", json=body))
        return Job(self, read.id, read)

    def job(self, job_id: str) -> Job:
        """A job by its id (read once: an unknown id is a `ClientError` 404)."""
        read = self._job_read(self.request("GET", f"/v1/jobs/{_segment(job_id)}"))
        return Job(self, read.id, read)

    def jobs(self, status: str | None = None, limit: int = 50, offset: int = 0) -> JobList:
        """A page of jobs, newest first."""
        from nas_service.api.schemas import JobList

        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status is not None:
            params["status"] = status
        return JobList.model_validate(self.request("GET", "/v1/jobs", params=params))

    def health(self) -> HealthRead:
        """The service's health (a degraded one is a `ClientError` 503 quoting it)."""
        from nas_service.api.health import HealthRead

        return HealthRead.model_validate(self.request("GET", "/v1/health"))

    @staticmethod
    def _job_read(data: Any) -> JobRead:
        from nas_service.api.schemas import JobRead

        return JobRead.model_validate(data)


class Job:
    """A job of the service: `id`, and `last`, the `JobRead` most recently fetched. Each
    method asks the service again."""

    def __init__(self, client: Client, job_id: str, last: JobRead | None = None) -> None:
        self.client, self.id = client, job_id
        self.last = last

    def __repr__(self) -> str:
        state = f", {self.last.status.value}" if self.last is not None else ""
        return f"Job({self.id!r}{state})"

    def _get(self, sub: str = "", **params: Any) -> Any:
        params = {k: v for k, v in params.items() if v is not None}
        return self.client.request("GET", f"/v1/jobs/{_segment(self.id)}{sub}", params=params)

    def read(self) -> JobRead:
        """The job now: status, progress, compute spent, ETA, its spec."""
        self.last = self.client._job_read(self._get())
        return self.last

    @property
    def status(self) -> JobStatus:
        return self.read().status

    def cancel(self) -> JobRead:
        """Cancel (a finished job is a `ClientError` 409 naming `status`)."""
        self.last = self.client._job_read(self.client.request("POST", f"/v1/jobs/{self.id}/cancel"))
        return self.last

    def wait(
        self,
        progress: bool = True,
        poll_s: float = 2.0,
        timeout_s: float | None = None,
        unhealthy_s: float = 120.0,
    ) -> JobRead:
        """Follow the job to its end and return it. `progress`: a bar of its training runs
        on stderr when stderr is a terminal (nothing elsewhere). The service's health is read
        at each poll, so a runner that stays down is a `ClientError`, not a hang: a degraded
        answer (503) is ridden out for `unhealthy_s` seconds in a row (a runner restarted by
        its supervisor, or one still connecting to its Ray, is back within seconds), then
        raised; `timeout_s` bounds the wait (`TimeoutError`)."""
        if not poll_s > 0:
            raise ValueError(f"poll_s: must be > 0 seconds, got {poll_s!r}")
        if not unhealthy_s >= 0:
            raise ValueError(f"unhealthy_s: must be >= 0 seconds, got {unhealthy_s!r}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        degraded_since: float | None = None
        bar = _Bar() if progress and sys.stderr.isatty() else None
        try:
            while True:
                job = self.read()
                if bar is not None:
                    bar.update(job)
                if job.status.value in FINISHED:
                    return job
                try:
                    self.client.request("GET", "/v1/health")
                    degraded_since = None
                except ClientError as exc:
                    now = time.monotonic()
                    if exc.status != 503:
                        raise
                    degraded_since = now if degraded_since is None else degraded_since
                    if now - degraded_since >= unhealthy_s:
                        raise
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still {job.status.value} after {timeout_s}s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()

    # -- results ----------------------------------------------------------------------------
    def trials(
        self,
        state: str | None = None,
        variant: str | None = None,
        curve: bool = False,
        limit: int | None = None,
        offset: int = 0,
        page: int = 1000,
    ) -> Trials:
        """The job's trials (filtered by `state`, `variant`; with `curve`, each evaluation
        curve), from `offset`, every one unless `limit` is given, read `page` at a time (the
        service's most is 1000)."""
        from nas_service.client.results import Trials

        pages: list[Any] = []
        total, at = None, offset
        while total is None or at < total:
            size = page if limit is None else min(page, limit - (at - offset))
            if size <= 0:
                break
            answer = self._get(
                "/trials",
                state=state,
                variant=variant,
                curve=str(curve).lower(),
                limit=size,
                offset=at,
            )
            total = int(answer["total"])
            pages.extend(answer["items"])
            if not answer["items"]:
                break
            at += len(answer["items"])
        return Trials.model_validate(
            {"items": pages, "total": total or 0, "limit": len(pages), "offset": offset}
        )

    def pareto(
        self, metrics: Sequence[str] | str, variant: str | None = None, profile: bool = True
    ) -> Pareto:
        """The Pareto front over two or more metrics (each minimised)."""
        from nas_service.client.results import Pareto

        names = metrics if isinstance(metrics, str) else ",".join(metrics)
        data = self._get("/pareto", metrics=names, variant=variant, profile=str(profile).lower())
        return Pareto.model_validate(data)

    def optimum(self, profile: bool = True, bootstrap: int = 200) -> Optimum:
        """The loss-optimal d_model/L_b per variant (and budget), with its interval."""
        from nas_service.client.results import Optimum

        data = self._get("/optimum", profile=str(profile).lower(), bootstrap=bootstrap)
        return Optimum.model_validate(data)

    def compare(self, reference: str = "baseline", level: float = 0.95) -> Comparison:
        """Each variant against `reference`, shape by shape, seed by seed."""
        from nas_service.client.results import Comparison

        return Comparison.model_validate(self._get("/compare", reference=reference, level=level))

    def sensitivity(self) -> Sensitivity:
        """The loss against each training axis, per variant and shape."""
        from nas_service.client.results import Sensitivity

        return Sensitivity.model_validate(self._get("/sensitivity"))

    def landscape(self) -> Landscape:
        """The job recorded as a landscape (what `depthscope export` writes)."""
        from nas_service.client.results import Landscape

        return Landscape.model_validate(self._get("/landscape"))

    def calibration(self, scope: str = "job") -> CalibrationRead:
        """The roofline against the measured step times, per device kind (`scope`: this
        job's trials, or every recent job's of its cluster)."""
        from nas_service.api.schemas import CalibrationRead

        return CalibrationRead.model_validate(self._get("/calibration", scope=scope))

    def plot(self, name: str, **params: Any) -> bytes:
        """A PNG of the job: `pareto` (give `metrics`), `optimum`, `compare`, `calibration`."""
        if name not in PLOTS:
            raise ClientError(f"no plot {name!r}; the plots: {', '.join(PLOTS)}", None, "name")
        data = self._get(f"/plots/{name}.png", **params)
        if not isinstance(data, bytes):
            raise ClientError(f"plot {name!r}: the service sent no image", None, "name")
        return data


class _Bar:
    """The progress bar of `Job.wait`: training runs done of the job's, with the trials
    counted, running and pruned, and the compute spent (tqdm, on stderr)."""

    def __init__(self) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self._bar = tqdm(total=0, unit="run", file=sys.stderr)

    def update(self, job: JobRead) -> None:
        p, c = job.progress, job.compute
        self._bar.total = p.runs_total or job.n_trials
        self._bar.n = p.runs_done or p.counted
        self._bar.set_postfix(
            trials=f"{p.counted}/{job.n_trials}",
            running=p.running,
            pruned=p.pruned,
            compute=f"{c.fraction:.0%}",
            refresh=False,
        )
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
