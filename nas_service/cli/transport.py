"""The one HTTP transport of the `depthscope` client commands (`_request`) and the command
line's errors. Below `nas_service.cli` (which re-exports the errors) and its `client`
commands, which call `transport._request` when they run (a test replaces it there).
Imports nothing but the standard library until a request is sent."""

from __future__ import annotations

import argparse
from typing import Any


class CliError(Exception):
    """A client command's failure, with the service's message; `code` is its exit status."""

    code = 1


class CliUsageError(CliError):
    """A command line naming something unusable (a spec path that is missing or not a
    regular file): exit status 2, as argparse gives a usage error."""

    code = 2


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One HTTP call to the service (`--url`, else DEPTHSCOPE_URL, else `DEFAULT_URL`; the
    token from DEPTHSCOPE_API_TOKEN) through the Python client's transport,
    `nas_service.client.Client.request` (a database outage retried with back-off). Errors
    become `CliError` with the service's status and message. Every client command sends
    through this function."""
    from nas_service.client import Client, ClientError

    try:
        with Client(getattr(args, "url", None)) as client:
            return client.request(method, path, **kwargs)
    except ClientError as exc:
        raise CliError(str(exc)) from None
