"""`depthscope` commands that run here: `cost` (the cost model only), `train` (one candidate,
torch), `db` (the schema), `runner` and `serve`. Each command imports what it needs when it
runs, so that `depthscope cost` never imports torch, Ray or the database layer."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from nas_service.cli.arch import add_arch_args, arch_values


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
    par.add_argument("--hardware", default="h100", help="a100 | h100 | h200 | cpu")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_cost)


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
    from cost_model import METRICS, ArchConfig, CostInputError, Parallelism, Workload, price
    from cost_model.residuals import BLOCK_SIZED, STREAMED

    try:
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
        reports = {}
        for variant in variants:
            own = {k: fields[k] if variant in owner else None for k, owner in owners.items()}
            cfg = ArchConfig(**(fields | own | {"variant": variant}))
            reports[variant] = (cfg, price(cfg, workload, parallel, args.hardware))
    except CostInputError as exc:
        print(f"depthscope cost: error: {exc}", file=sys.stderr)
        return 2

    if args.json:
        out = {
            v: {"arch": cfg.to_dict(), "cost": report.as_dict()}
            for v, (cfg, report) in reports.items()
        }
        print(json.dumps(out if len(out) > 1 else next(iter(out.values())), indent=2))
        return 0

    first = next(iter(reports.values()))[0]
    print(
        f"L_b={first.n_layers} d_model={first.d_model} heads={first.n_heads} "
        f"vocab={first.vocab_size} seq={first.seq_len} dtype={first.dtype} "
        f"hardware={args.hardware} TP={args.tp} PP={args.pp}x{args.vpp} DP={args.dp}"
    )
    names = list(reports)
    width = max(12, *(len(n) + 2 for n in names))
    print(f"{'metric':32}" + "".join(f"{n:>{width}}" for n in names))
    columns = {n: r.metrics() for n, (_, r) in reports.items()}
    for metric, (unit, _) in METRICS.items():
        cells = "".join(f"{_human(columns[n][metric], unit):>{width}}" for n in names)
        print(f"{metric:32}" + cells)
    return 0


def _add_train_parser(sub: Any, arch: bool) -> None:
    p = sub.add_parser(
        "train",
        help="train one candidate on a fixed budget",
        description="Train one architecture for exactly its budget (FLOPs or tokens) and "
        "print the result. Progress goes to stderr.",
    )
    if arch:
        add_arch_args(p, many_variants=False)
    run = p.add_argument_group("training")
    budget = run.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=float, help="training FLOPs budget (e.g. 3e13)")
    budget.add_argument("--tokens", type=int, help="training tokens budget")
    run.add_argument("--batch-size", type=int, default=16)
    run.add_argument("--lr", type=float, default=3e-3)
    run.add_argument("--schedule", default="cosine", help="cosine | wsd")
    run.add_argument("--warmup-frac", type=float, default=0.05)
    run.add_argument("--weight-decay", type=float, default=0.1)
    run.add_argument(
        "--depth-lr-mult",
        type=float,
        default=1.0,
        help="learning-rate multiplier of the depth-mixing parameters only",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--eval-interval", type=int, help="steps between evaluations")
    run.add_argument("--eval-batches", type=int, default=8)
    run.add_argument("--corpus", help="text file, folder or token file (default: built-in)")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda")
    run.add_argument("--threads", type=int, help="torch threads")
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from cost_model import ArchConfig, CostInputError

    try:
        arch = ArchConfig(**arch_values(args))  # before torch loads: a bad flag fails fast
    except CostInputError as exc:
        print(f"depthscope train: error: {exc}", file=sys.stderr)
        return 2
    from workers.contract import TrainSpec
    from workers.data import CorpusError
    from workers.train import train

    try:
        spec = TrainSpec(
            arch=arch,
            budget_flops=args.flops,
            budget_tokens=args.tokens,
            batch_size=args.batch_size,
            lr=args.lr,
            schedule=args.schedule,
            warmup_frac=args.warmup_frac,
            weight_decay=args.weight_decay,
            depth_lr_mult=args.depth_lr_mult,
            seed=args.seed,
            eval_interval=args.eval_interval,
            eval_batches=args.eval_batches,
            corpus=args.corpus,
            device=args.device,
            threads=args.threads,
            compile=args.compile,
        )
        bar = None
        if not args.quiet:
            from tqdm import tqdm  # type: ignore[import-untyped]

            bar = tqdm(total=spec.planned_steps(), unit="step", file=sys.stderr, leave=True)

        def progress(step: int, steps: int, loss: float) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        def on_eval(point: Any) -> bool:
            if bar is not None:
                bar.write(f"step {point.step}: val_loss {point.val_loss:.4f}", file=sys.stderr)
            return False

        result = train(spec, on_eval=on_eval, on_step=progress)
        if bar is not None:
            bar.close()
    except (CostInputError, CorpusError) as exc:
        print(f"depthscope train: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(
            f"{result.status}: {result.reason}\n"
            f"final val_loss {result.final_val_loss:.4f} (best {result.best_val_loss:.4f})\n"
            f"tokens {result.tokens_seen:,}  FLOPs {result.flops_spent:.3e}  "
            f"wall {result.wall_time_s:.1f}s  {result.tokens_per_s:,.0f} tokens/s\n"
            f"peak memory {result.peak_memory_bytes / 2**20:.0f} MiB ({result.memory_kind})  "
            f"corpus {result.corpus.get('name')} {str(result.corpus.get('checksum'))[:12]}"
        )
    return 0 if result.status != "diverged" else 3


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

    from nas_service.db import current, downgrade, head, upgrade
    from nas_service.settings import get_settings

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
    from nas_service.runner import main as runner_main

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
    from nas_service.settings import get_settings

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    settings = get_settings(**overrides)
    local = ("local",) if "local" in settings.clusters else ()  # the operator may remove it
    app = create_app(settings, run_clusters=() if args.no_runner else local)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def add_parsers(sub: Any, arch: bool = True) -> None:
    """The local commands; `arch=False` leaves out the architecture flags of `cost` and
    `train` (they import the cost model) for a run of another command."""
    _add_cost_parser(sub, arch)
    _add_train_parser(sub, arch)
    _add_db_parser(sub)
    _add_runner_parser(sub)
    _add_serve_parser(sub)
