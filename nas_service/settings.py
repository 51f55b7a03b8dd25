"""Service settings (pydantic-settings, environment prefix `DEPTHSCOPE_`).

Built by `get_settings()` and injected; nothing reads them at import time. Nested values use
`__`: `DEPTHSCOPE_CLUSTERS__GPU__ADDRESS=10.0.0.5:6379`. Clusters are named here, never
given as raw addresses in a job request. Named clusters add to `local` (always configured
while `local_cluster` is True, and never when it is False). Corpora are registered by name:
`DEPTHSCOPE_CORPORA__SHAKESPEARE=/data/plays.txt` (names are simple identifiers; the
environment gives them in lower case). The artifact store of multi-fidelity jobs
(`DEPTHSCOPE_ARTIFACT_STORE`) is likewise the operator's alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ClusterSettings(BaseModel):
    """A Ray cluster jobs may run on. `address=None` starts a local Ray in the service.

    A cluster started with `ray start --head` (Ray ≥ 2.60) uses token authentication: set
    `auth_mode="token"` and the cluster's `auth_token` (or `auth_mode="disabled"` for a head
    started with `RAY_AUTH_MODE=disabled`)."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    auth_mode: str | None = None  # token | disabled (exported as RAY_AUTH_MODE)
    auth_token: SecretStr | None = None  # exported as RAY_AUTH_TOKEN
    num_cpus: int | None = Field(default=None, ge=1)  # local Ray only
    ship_code: bool = False  # send the project's code with Ray's runtime environment

    @field_validator("auth_mode")
    @classmethod
    def _known_mode(cls, value: str | None) -> str | None:
        if value is not None and value not in ("token", "disabled"):
            raise ValueError("must be token or disabled")
        return value


#: The default limit on one candidate's training FLOPs: about a day of one accelerator
#: sustaining 1e13 FLOP/s (a week of a 2-core CPU at 1e12 FLOP/s in all: 6e17). An
#: operator whose clusters do more raises `DEPTHSCOPE_MAX_BUDGET_FLOPS`.
DEFAULT_MAX_BUDGET_FLOPS = 1e18
#: Bytes one parameter takes in training: fp32 weights, gradients and Adam's two moments.
TRAINING_BYTES_PER_PARAM = 16
#: `default_max_params` where the machine's memory cannot be read.
FALLBACK_MAX_PARAMS = 1e9
#: Where a cgroup v2 container's memory limit is read.
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


def machine_memory_bytes() -> int | None:
    """The memory this process may use: the machine's physical memory, or its container's
    limit (cgroup v2) where lower; None where neither can be read."""
    known: list[int] = []
    with contextlib.suppress(AttributeError, OSError, ValueError):
        known.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        limit = CGROUP_MEMORY_MAX.read_text(encoding="ascii").strip()
    except OSError:
        limit = ""
    if limit.isdigit():
        known.append(int(limit))
    known = [k for k in known if k > 0]
    return min(known) if known else None


def default_max_params(memory: int | None = None) -> float:
    """The default limit on one candidate's parameters: as many as `memory` (default: this
    machine's, `machine_memory_bytes`) holds in training (`TRAINING_BYTES_PER_PARAM` each),
    rounded down to two significant digits; `FALLBACK_MAX_PARAMS` where it is unknown. A
    24 GiB machine: 1.6e9. An operator whose workers have more memory raises
    `DEPTHSCOPE_MAX_PARAMS`."""
    memory = machine_memory_bytes() if memory is None else memory
    if not memory or memory <= 0:
        return FALLBACK_MAX_PARAMS
    params = memory / TRAINING_BYTES_PER_PARAM
    scale = 10 ** (math.floor(math.log10(params)) - 1)
    return float(math.floor(params / scale) * scale)


#: A registered corpus name: a letter or underscore, then letters, digits, "_" or "-".
#: The cluster of the service's own machine (a local Ray): where a job that names no cluster
#: runs, while `Settings.local_cluster` is True.
LOCAL_CLUSTER = "local"
#: The longest cluster name a job may give (`JobSpec.cluster`, `ds_jobs.cluster`).
MAX_CLUSTER_NAME = 100
CORPUS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DEPTHSCOPE_", env_nested_delimiter="__", extra="forbid"
    )

    database_url: str = "sqlite:///depthscope.db"
    clusters: dict[str, ClusterSettings] = Field(default_factory=dict)  # and `local`, below
    api_token: SecretStr | None = None
    max_trials: int = Field(default=1000, ge=1)
    # training FLOPs of one candidate: a conservative fixed default (`DEFAULT_MAX_BUDGET_FLOPS`)
    max_budget_flops: float = Field(default=DEFAULT_MAX_BUDGET_FLOPS, gt=0)
    max_concurrent_jobs: int = Field(default=8, ge=1)
    max_concurrent_trials: int = Field(default=64, ge=1)
    max_seeds: int = Field(default=5, ge=1)
    max_candidates_enumerated: int = Field(default=200_000, ge=1)
    max_request_bytes: int = Field(default=1 << 20, ge=1024)
    # Operator limits on one job; a spec over any is refused with the field, value and limit.
    max_budget_tokens: float = Field(default=1e13, gt=0)  # training tokens per candidate
    max_job_flops: float = Field(default=1e24, gt=0)  # estimated compute of a whole job
    # parameters of one candidate: by default what this machine's memory can train
    # (`default_max_params`)
    max_params: float = Field(default_factory=lambda: default_max_params(), gt=0)
    max_n_layers: int = Field(default=512, ge=1)
    max_d_model: int = Field(default=32768, ge=1)
    max_seq_len: int = Field(default=131072, ge=2)
    max_batch_size: int = Field(default=4096, ge=1)
    max_threads: int = Field(default=64, ge=1)  # torch threads (CPUs) one trial asks for
    max_axis_values: int = Field(default=10_000, ge=1)  # values of one searched axis
    # training runs of a whole job: n_trials × seeds × the settings of `tune`
    max_job_runs: int = Field(default=20_000, ge=1)
    # Corpora: `training.corpus` names one of these, or a path inside `data_dir`.
    data_dir: Path = Path("depthscope-data")
    corpora: dict[str, Path] = Field(default_factory=dict)
    # Named clusters add to `local`; set False to run only the named ones.
    local_cluster: bool = True
    # A job's results are re-read from the database at most this often (seconds; 0: on
    # every request). Pollers see a new trial at most this late.
    results_fresh_s: float = Field(default=0.25, ge=0, le=60)
    # The database pool of each process (API and runner).
    db_pool_size: int = Field(default=10, ge=1)
    db_max_overflow: int = Field(default=20, ge=0)
    db_pool_timeout_s: float = Field(default=10.0, gt=0)
    # One runner per cluster: a lease in the database, renewed every lease_s / 3.
    runner_lease_s: float = Field(default=30.0, ge=1)
    # A trial left running by this many runner crashes in a row is failed, not retried.
    max_trial_recoveries: int = Field(default=3, ge=1)
    # A job whose trials raise inside the runner this many times is failed.
    max_job_errors: int = Field(default=5, ge=1)
    # Multi-fidelity jobs keep each candidate's checkpoint between rungs here: a folder or
    # an fsspec URL (s3://bucket/prefix, …). Only the operator sets it; a job has no field
    # for it. It may hold credentials: messages name only its kind (`check_job`).
    artifact_store: str = "depthscope-artifacts"
    max_checkpoint_bytes: int = Field(default=1 << 30, ge=1)  # one checkpoint read back
    # A store that fails a write is the operator's fault, never the candidate's: the job
    # pauses and the run is tried again after store_retry_s, 2×, 4×… (at most 60 s); the job
    # fails once the store has failed this many times in a row.
    store_retries: int = Field(default=5, ge=1)
    store_retry_s: float = Field(default=1.0, gt=0, le=60)
    # The runner's Ray must answer within this many seconds (`ray.init`), or the runner
    # exits with the reason (and the service starts it again).
    ray_connect_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("corpora")
    @classmethod
    def _corpus_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name in value:
            if not CORPUS_NAME.fullmatch(name):
                raise ValueError(
                    f"corpus name {name!r} is not a simple identifier "
                    "(a letter or _, then letters, digits, _ or -; at most 64)"
                )
        return value

    @model_validator(mode="after")
    def _local(self) -> Settings:
        """`local` is always a cluster while `local_cluster` is True (a default
        `ClusterSettings()` unless configured explicitly), and never when it is False."""
        if self.local_cluster:
            if LOCAL_CLUSTER not in self.clusters:
                self.clusters = {LOCAL_CLUSTER: ClusterSettings(), **self.clusters}
        elif LOCAL_CLUSTER in self.clusters:
            self.clusters = {k: v for k, v in self.clusters.items() if k != LOCAL_CLUSTER}
        return self


def get_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (tests, the CLI)."""
    return Settings(**overrides)  # type: ignore[arg-type]
