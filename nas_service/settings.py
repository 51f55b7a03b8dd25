"""Service settings (pydantic-settings, environment prefix `DEPTHSCOPE_`).

Built by `get_settings()` and injected; nothing reads them at import time. Nested values use
`__`: `DEPTHSCOPE_CLUSTERS__GPU__ADDRESS=10.0.0.5:6379`. Clusters are named here, never
given as raw addresses in a job request.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DEPTHSCOPE_", env_nested_delimiter="__", extra="forbid"
    )

    database_url: str = "sqlite:///depthscope.db"
    clusters: dict[str, ClusterSettings] = Field(
        default_factory=lambda: {"local": ClusterSettings()}
    )
    api_token: SecretStr | None = None
    max_trials: int = Field(default=1000, ge=1)
    max_budget_flops: float = Field(default=1e21, gt=0)
    max_concurrent_jobs: int = Field(default=8, ge=1)
    max_concurrent_trials: int = Field(default=64, ge=1)
    max_seeds: int = Field(default=5, ge=1)
    max_candidates_enumerated: int = Field(default=200_000, ge=1)
    max_request_bytes: int = Field(default=1 << 20, ge=1024)
    data_dir: Path = Path("depthscope-data")


def get_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (tests, the CLI)."""
    return Settings(**overrides)  # type: ignore[arg-type]
