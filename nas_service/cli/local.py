"""`depthscope` commands that run here: `cost` (the cost model only), `db` (the schema),
`runner` and `serve`; `train` (one candidate, torch) is `cli.train`. Each command imports what
it needs when it runs, so that `depthscope cost` never imports torch, Ray or the database
layer."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from nas_service.cli import train
from nas_service.cli.arch import add_arch_args, add_cluster_args, arch_values, cluster_hardware


def _add_cost_parser(sub: Any, arch: bool) -> None:
    p = sub.add_parser(
        "cost",
        help="price architectures with the analytic cost model",
        description="Price one architecture, or compare residual variants side by side "
        "(--variant a,b,c), with the analytic cost model.",
    )
    if arch:
        add_arch_args(p, many_variants=True)
    work = p.add_argument_group("workload")
    work.add_argument("--micro-batch", type=int, default=8)
    work.add_argument("--microbatches", type=int, default=1)
    work.add_argument("--recompute", default="none", help="none | selective | full")
    work.add_argument("--prefill-tokens", type=int)
    work.add_argument("--prefill-chunk", type=int)
    work.add_argument("--decode-context", type=int)
    work.add_argument("--decode-batch", type=int, default=1)
    par = p.add_argument_group("parallelism and hardware")
    par.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    par.add_argument("--pp", type=int, default=1, help="pipeline stages P")
    par.add_argument("--vpp", type=int, default=1, help="virtual stages per rank V")
    par.add_argument("--dp", type=int, default=1, help="data-parallel ranks")
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument(
        "--hardware",
        default="h100",
        help="a100 | h100 | h200 (one GPU of a DGX server; dgx-a100 … name the same) | cpu",
    )
    auto = p.add_argument_group(
        "layout search (--layout auto)",
        "the fastest layout of tensor, pipeline, virtual stages, data, micro-batch, "
        "recomputation and sequence parallelism on --devices devices that fits the memory cap; "
        "it replaces --tp, --pp, --vpp, --dp, --sequence-parallel, --micro-batch, "
        "--microbatches and --recompute",
    )
    auto.add_argument("--layout", default="fixed", choices=("fixed", "auto"))
    auto.add_argument("--devices", type=_positive_int, help="devices to lay the model out on")
    auto.add_argument(
        "--global-batch",
        type=_positive_int,
        help="sequences per optimizer step (default: 8 per device)",
    )
    auto.add_argument(
        "--memory-cap",
        type=_byte_size,
        metavar="SIZE",
        help="memory per device, e.g. 80GB, 75GiB or bytes (default: the hardware's)",
    )
    auto.add_argument(
        "--max-virtual",
        type=_positive_int,
        default=4,
        help="most virtual stages per pipeline rank to try (default: 4)",
    )
    auto.add_argument(
        "--all-layouts", action="store_true", help="also list every feasible layout, fastest first"
    )
    add_cluster_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_cost)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


#: Units of `--memory-cap`: decimal (kB … TB, as the presets' 80e9) and binary (KiB … TiB).
_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _byte_size(text: str) -> float:
    """A size in bytes: a number with an optional unit of `_BYTE_UNITS` (80GB = 80e9 bytes)."""
    stripped = text.strip().lower()
    number, unit = stripped, "b"
    for name in sorted(_BYTE_UNITS, key=len, reverse=True):
        if stripped.endswith(name):
            number, unit = stripped[: -len(name)].strip(), name
            break
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (a number of bytes, or with a unit: 80GB, 75GiB)"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive size, got {text!r}")
    return value


#: The fixed layout's flags (`--layout auto` searches them): destination → default.
_SEARCHED_FLAGS: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "vpp": 1,
    "dp": 1,
    "sequence_parallel": False,
    "micro_batch": 8,
    "microbatches": 1,
    "recompute": "none",
}
_AUTO_FLAGS: dict[str, Any] = {
    "devices": None,
    "global_batch": None,
    "memory_cap": None,
    "max_virtual": 4,
    "all_layouts": False,
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_layout_flags(args: argparse.Namespace) -> None:
    """`--layout auto` needs --devices and takes none of the fixed layout's flags; a fixed
    layout takes none of the search's (a flag given is never ignored)."""
    from cost_model import CostInputError

    if args.layout == "fixed":
        for dest, default in _AUTO_FLAGS.items():
            if getattr(args, dest) != default:
                raise CostInputError(_flag(dest), "only with --layout auto")
        return
    for dest, default in _SEARCHED_FLAGS.items():
        if getattr(args, dest) != default:
            raise CostInputError(_flag(dest), "--layout auto searches it; leave it out")
    if args.devices is None:
        raise CostInputError("--devices", "--layout auto needs the number of devices")


def _human(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or scale == 1e-6:
                return f"{value / scale:.3g} {suffix}"
    base, suffix = (1024.0, "B") if unit == "bytes" else (1000.0, "")
    prefixes = ["", "K", "M", "G", "T", "P", "E"]
    if unit == "bytes":
        prefixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    scaled, i = float(value), 0
    while abs(scaled) >= base and i < len(prefixes) - 1:
        scaled /= base
        i += 1
    label = {"FLOPs": "FLOP", "parameters": ""}.get(unit, suffix)
    text = f"{scaled:.4g} {prefixes[i]}{label}".rstrip()
    return text


def _cmd_cost(args: argparse.Namespace) -> int:
    from cost_model import (
        METRICS,
        ArchConfig,
        CostInputError,
        LayoutSpace,
        Parallelism,
        Workload,
        price,
        search_layout,
    )
    from cost_model.residuals import BLOCK_SIZED, STREAMED

    searches: dict[str, Any] = {}
    try:
        _check_layout_flags(args)
        fields = arch_values(args)
        variants = [v.strip() for v in str(fields["variant"]).split(",") if v.strip()]
        if not variants:
            raise CostInputError("variant", "give at least one")
        workload = Workload(
            micro_batch=args.micro_batch,
            seq_len=fields["seq_len"],
            microbatches=args.microbatches,
            recompute=args.recompute,
            prefill_tokens=args.prefill_tokens,
            prefill_chunk=args.prefill_chunk,
            decode_context=args.decode_context,
            decode_batch=args.decode_batch,
        )
        parallel = Parallelism(
            tensor=args.tp,
            pipeline=args.pp,
            virtual=args.vpp,
            data=args.dp,
            sequence_parallel=args.sequence_parallel,
        )
        # side by side, the block size and the streams go to the variants that have them
        owners = {"block_size": BLOCK_SIZED, "mhc_streams": STREAMED}
        what = {"block_size": "a block size", "mhc_streams": "streams"}
        for name, owner in owners.items():
            if fields[name] is not None and not set(variants) & set(owner):
                raise CostInputError(name, f"only {', '.join(owner)} has {what[name]}")
        hardware = cluster_hardware(args)
        total = args.nodes * hardware.devices_per_node if args.nodes else None
        if total is not None and args.tp > total:
            raise CostInputError("--tp", f"{args.tp} ranks, more than the cluster's {total}")
        space = None
        if args.layout == "auto":
            hardware.check_devices(args.devices, "--devices")
            if total is not None and args.devices > total:
                raise CostInputError("--devices", f"more than the cluster's {total} devices")
            space = LayoutSpace(
                devices=args.devices,
                global_batch=args.global_batch or Workload().micro_batch * args.devices,
                max_virtual=args.max_virtual,
            )
        reports = {}
        for variant in variants:
            own = {k: fields[k] if variant in owner else None for k, owner in owners.items()}
            cfg = ArchConfig(**(fields | own | {"variant": variant}))
            if space is None:
                reports[variant] = (cfg, price(cfg, workload, parallel, hardware))
                continue
            found = search_layout(
                cfg, space, workload, hardware, args.memory_cap, keep=len(space.layouts())
            )
            if found.best is None:
                field = "--memory-cap" if found.divisible else "--devices"
                raise CostInputError(field, f"{variant}: {found.reason}")
            best = found.best.layout
            searches[variant] = found
            reports[variant] = (
                cfg,
                price(cfg, best.workload(workload), best.parallelism(), hardware),
            )
    except CostInputError as exc:
        print(f"depthscope cost: error: {exc}", file=sys.stderr)
        return 2

    if args.json:
        out: dict[str, Any] = {}
        for v, (cfg, report) in reports.items():
            out[v] = {"arch": cfg.to_dict(), "cost": report.as_dict()}
            if v in searches:
                search = searches[v].as_dict()
                if not args.all_layouts:
                    search["feasible"] = []
                out[v]["layout"] = search
        print(json.dumps(out if len(out) > 1 else next(iter(out.values())), indent=2))
        return 0

    first = next(iter(reports.values()))[0]
    where = f"TP={args.tp} PP={args.pp}x{args.vpp} DP={args.dp}"
    if searches:
        where = f"devices={args.devices}, each variant at its fastest layout"
    print(
        f"L_b={first.n_layers} d_model={first.d_model} heads={first.n_heads} "
        f"vocab={first.vocab_size} seq={first.seq_len} dtype={first.dtype} "
        f"hardware={args.hardware} {where}"
    )
    print(_hardware_text(hardware, first.dtype))
    for variant, found in searches.items():
        _print_search(variant, found, args.all_layouts)
    names = list(reports)
    width = max(12, *(len(n) + 2 for n in names))
    print(f"{'metric':32}" + "".join(f"{n:>{width}}" for n in names))
    columns = {n: r.metrics() for n, (_, r) in reports.items()}
    for metric, (unit, _) in METRICS.items():
        cells = "".join(f"{_human(columns[n][metric], unit):>{width}}" for n in names)
        print(f"{metric:32}" + cells)
    for key in ("mfu", "hfu"):  # against the datasheet peak
        values = {n: r.utilisation[key] for n, (_, r) in reports.items()}
        print(
            f"{key + ' (of datasheet peak)':32}"
            + "".join(f"{values[n]:>{width}.1%}" for n in names)
        )
    return 0


def _hardware_text(hw: Any, dtype: str) -> str:
    """The device's datasheet peak beside the achievable one, and its nodes and networks."""
    nets = ", ".join(
        f"{n.name} {n.bandwidth / 1e9:.4g} GB/s {n.latency_s * 1e6:.3g} µs" for n in hw.networks()
    )
    per_node = f"{hw.devices_per_node} per node" if hw.devices_per_node else "one network"
    return (
        f"{hw.name}: {dtype} peak {_human(hw.peak(dtype), 'FLOPs')}/s datasheet, "
        f"{_human(hw.achievable(dtype), 'FLOPs')}/s achievable ({hw.compute_efficiency:.2f}); "
        f"memory {hw.memory_bandwidth / 1e9:.4g} GB/s datasheet, "
        f"{hw.achievable_bandwidth / 1e9:.4g} GB/s achievable ({hw.memory_efficiency:.2f}); "
        f"{per_node}: {nets}. Fractions: {hw.efficiency_source}"
    )


def _layout_text(lay: Any) -> str:
    sp = " SP" if lay.sequence_parallel else ""
    return (
        f"TP={lay.tensor}{sp} PP={lay.pipeline}x{lay.virtual} DP={lay.data} "
        f"micro-batch={lay.micro_batch}x{lay.microbatches} recompute={lay.recompute}"
    )


def _print_search(variant: str, found: Any, all_layouts: bool) -> None:
    """The best layout of one variant, its step time, memory and link bytes, and with
    `all_layouts` every feasible layout, fastest first."""
    best = found.best
    print(
        f"best layout ({variant}): {_layout_text(best.layout)}: step "
        f"{_human(best.step_time_s, 'seconds')}, memory {_human(best.memory_bytes, 'bytes')} "
        f"per device (cap {_human(found.memory_cap_bytes, 'bytes')}), comm "
        f"{_human(best.comm_bytes, 'bytes')} per device and step; {found.feasible_count} of "
        f"{found.enumerated} layouts feasible ({found.divisible} divide the model)"
    )
    if not all_layouts:
        return
    print(f"  {'layout':58} {'step':>10} {'memory':>12} {'comm':>12}")
    for row in found.feasible:
        print(
            f"  {_layout_text(row.layout):58} {_human(row.step_time_s, 'seconds'):>10} "
            f"{_human(row.memory_bytes, 'bytes'):>12} {_human(row.comm_bytes, 'bytes'):>12}"
        )


def _add_db_parser(sub: Any) -> None:
    p = sub.add_parser(
        "db",
        help="manage the service's database schema (Alembic)",
        description="Upgrade, downgrade or show the schema of the service's own tables. "
        "The URL defaults to DEPTHSCOPE_DATABASE_URL (else a local SQLite file).",
    )
    dbsub = p.add_subparsers(dest="db_command", required=True)
    for name, helptext in (
        ("upgrade", "migrate to a revision (default: head)"),
        ("downgrade", "migrate back to a revision (e.g. base)"),
        ("current", "print the current revision"),
    ):
        q = dbsub.add_parser(name, help=helptext)
        if name != "current":
            q.add_argument("revision", nargs="?" if name == "upgrade" else None, default="head")
        q.add_argument("--url", help="database URL")
    p.set_defaults(func=_cmd_db)


def _cmd_db(args: argparse.Namespace) -> int:
    import logging

    from sqlalchemy.exc import SQLAlchemyError

    from nas_service.settings import get_settings
    from nas_service.store import current, downgrade, head, upgrade

    logging.getLogger("alembic").setLevel(logging.WARNING)
    url = args.url or get_settings().database_url
    try:
        if args.db_command == "upgrade":
            upgrade(url, args.revision)
        elif args.db_command == "downgrade":
            downgrade(url, args.revision)
        rev = current(url)
    except (SQLAlchemyError, ValueError) as exc:
        print(f"depthscope db: error: {exc}", file=sys.stderr)
        return 2
    if rev is None:
        print("none")
    else:
        print(f"{rev} (head)" if rev == head() else rev)
    return 0


def _add_runner_parser(sub: Any) -> None:
    p = sub.add_parser(
        "runner",
        help="run the search jobs of one cluster",
        description="Drive every pending or running job of a cluster to completion (or, "
        "with --forever, keep polling for new ones). Safe to restart after a crash.",
        add_help=False,
    )
    p.set_defaults(func=_cmd_runner, forward=True)  # its arguments go to the runner's parser


def _cmd_runner(args: argparse.Namespace) -> int:
    from nas_service.runner.loop import main as runner_main

    return runner_main(list(args.args))


def _add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the HTTP API (and the local runner)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", help="default: DEPTHSCOPE_DATABASE_URL")
    p.add_argument("--no-runner", action="store_true", help="serve the API only")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from nas_service.api.app import create_app
    from nas_service.settings import LOCAL_CLUSTER, get_settings

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    settings = get_settings(**overrides)
    # the operator may remove the local cluster
    local = (LOCAL_CLUSTER,) if LOCAL_CLUSTER in settings.clusters else ()
    app = create_app(settings, run_clusters=() if args.no_runner else local)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def add_parsers(sub: Any, arch: bool = True) -> None:
    """The local commands; `arch=False` leaves out the architecture flags of `cost` and
    `train` (they import the cost model) for a run of another command."""
    _add_cost_parser(sub, arch)
    train.add_parser(sub, arch)
    _add_db_parser(sub)
    _add_runner_parser(sub)
    _add_serve_parser(sub)
