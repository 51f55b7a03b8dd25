"""The depthscope service: job storage, the search runner, the HTTP API and the CLI; and its
Python client, `Client` (`nas_service.client`), loaded when first asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nas_service.client import Client, ClientError, Job, ServiceUnavailable

__all__ = ["Client", "ClientError", "Job", "ServiceUnavailable"]


def __getattr__(name: str) -> Any:
    """`Client`, `Job`, `ClientError`, `ServiceUnavailable` from `nas_service.client`,
    imported on first use (the command line and the workers import this package too)."""
    if name in __all__:
        from nas_service import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
