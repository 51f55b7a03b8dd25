"""The `depthscope` command line: `main` and its parser, and the one HTTP transport of the
client commands (`_request`).

- `arch`: the architecture flags, one per `cost_model.ArchConfig` field, and `--arch FILE`;
- `local`: `cost`, `train`, `db`, `runner`, `serve`;
- `client`: `submit [--wait]`, `status`, `cancel`, `trials`, `pareto`, `optimum`, `compare`,
  `sensitivity`, `export`.

Importing this package imports nothing but the standard library; the subcommands' modules
load when the parser is built, and each command imports what it needs when it runs, so that
`depthscope cost` never imports torch, Ray or the database layer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from nas_service.client import DEFAULT_URL as DEFAULT_URL


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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command`, one that parses that command (the architecture
    flags, which import the cost model and numpy, only for `cost` and `train`)."""
    from nas_service.cli import client, local

    parser = argparse.ArgumentParser(
        prog="depthscope",
        description="Architecture search and cost modelling for Transformer residual connections.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    local.add_parsers(sub, arch=command in (None, "cost", "train"))
    client.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words[0] if words else "")
    args, rest = parser.parse_known_args(words)
    if getattr(args, "forward", False):  # `runner`: its own parser reads the rest, in order
        args.args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    result: int = args.func(args)
    return result


def __getattr__(name: str) -> Any:
    """The client's commands (`_cmd_submit`, `_follow`, …) as attributes of the package,
    imported when first asked for."""
    if name.startswith("_cmd_") or name == "_follow":
        from nas_service.cli import client, local

        for module in (client, local):
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
