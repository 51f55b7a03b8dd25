"""The `depthscope` command line: `main` and its parser. The one HTTP transport of the client
commands (`transport._request`) and the errors (`CliError`, `CliUsageError`) live in
`transport.py`, below the commands' modules; the errors are re-exported here.

- `arch`: the architecture flags, one per `cost_model.ArchConfig` field, and `--arch FILE`;
- `local`: `cost`, `db`, `runner`, `serve`, and `train` (its own module, `train`);
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

from nas_service.cli.transport import CliError as CliError
from nas_service.cli.transport import CliUsageError as CliUsageError
from nas_service.client import DEFAULT_URL as DEFAULT_URL


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
        from nas_service.cli import client, local, train

        for module in (client, local, train):
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
