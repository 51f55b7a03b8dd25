"""The `depthscope` command line.

Subcommands import what they need when they run, so that `depthscope cost` never imports
torch, Ray or the database layer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any


def _add_arch_args(p: argparse.ArgumentParser, many_variants: bool) -> None:
    arch = p.add_argument_group("architecture")
    arch.add_argument("--n-layers", type=int, required=True, help="Transformer blocks L_b")
    arch.add_argument("--d-model", type=int, required=True)
    arch.add_argument("--n-heads", type=int, required=True)
    arch.add_argument("--n-kv-heads", type=int)
    arch.add_argument("--vocab-size", type=int, default=256)
    arch.add_argument("--seq-len", type=int, default=256)
    arch.add_argument("--d-ff", type=int)
    arch.add_argument("--ff-ratio", type=float)
    arch.add_argument("--mlp", default="gelu")
    arch.add_argument("--norm", default="rmsnorm")
    arch.add_argument("--positions", default="rope")
    arch.add_argument("--bias", action="store_true", help="biases in linear layers and norms")
    arch.add_argument("--untied", action="store_true", help="an LM head of its own")
    arch.add_argument(
        "--variant",
        default="baseline",
        help="residual variant"
        + (", or a comma-separated list to compare side by side" if many_variants else ""),
    )
    arch.add_argument("--block-size", type=int, help="S in sublayers (block_attnres)")
    arch.add_argument("--mhc-streams", type=int, help="n streams (mhc_lite)")
    arch.add_argument("--dtype", default="float32")


def _arch_from_args(args: argparse.Namespace, variant: str) -> Any:
    from cost_model import ArchConfig

    return ArchConfig(
        n_layers=args.n_layers,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        d_ff=args.d_ff,
        ff_ratio=args.ff_ratio,
        mlp=args.mlp,
        norm=args.norm,
        positions=args.positions,
        bias=args.bias,
        tie_embeddings=not args.untied,
        variant=variant,
        block_size=args.block_size if variant == "block_attnres" else None,
        mhc_streams=args.mhc_streams if variant == "mhc_lite" else None,
        dtype=args.dtype,
    )


def _add_cost_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cost",
        help="price architectures with the analytic cost model",
        description="Price one architecture, or compare residual variants side by side "
        "(--variant a,b,c), with the analytic cost model.",
    )
    _add_arch_args(p, many_variants=True)
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
    from cost_model import METRICS, CostInputError, Parallelism, Workload, price

    variants = [v.strip() for v in args.variant.split(",") if v.strip()]
    try:
        workload = Workload(
            micro_batch=args.micro_batch,
            seq_len=args.seq_len,
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
        if args.block_size is not None and "block_attnres" not in variants:
            raise CostInputError("block_size", "only block_attnres has a block size")
        if args.mhc_streams is not None and "mhc_lite" not in variants:
            raise CostInputError("mhc_streams", "only mhc_lite has streams")
        reports = {}
        for variant in variants:
            cfg = _arch_from_args(args, variant)
            reports[variant] = (cfg, price(cfg, workload, parallel, args.hardware))
    except CostInputError as exc:
        print(f"depthscope cost: error: {exc}", file=sys.stderr)
        return 2
    if not variants:
        print("depthscope cost: error: variant: give at least one", file=sys.stderr)
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


def _add_train_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train one candidate on a fixed budget",
        description="Train one architecture for exactly its budget (FLOPs or tokens) and "
        "print the result. Progress goes to stderr.",
    )
    _add_arch_args(p, many_variants=False)
    run = p.add_argument_group("training")
    budget = run.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=float, help="training FLOPs budget (e.g. 3e13)")
    budget.add_argument("--tokens", type=int, help="training tokens budget")
    run.add_argument("--batch-size", type=int, default=16)
    run.add_argument("--lr", type=float, default=3e-3)
    run.add_argument("--schedule", default="cosine", help="cosine | wsd")
    run.add_argument("--warmup-frac", type=float, default=0.05)
    run.add_argument("--weight-decay", type=float, default=0.1)
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
    from cost_model import CostInputError
    from workers.data import CorpusError
    from workers.train import TrainSpec, train

    try:
        spec = TrainSpec(
            arch=_arch_from_args(args, args.variant),
            budget_flops=args.flops,
            budget_tokens=args.tokens,
            batch_size=args.batch_size,
            lr=args.lr,
            schedule=args.schedule,
            warmup_frac=args.warmup_frac,
            weight_decay=args.weight_decay,
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
            from tqdm import tqdm

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
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_runner)


def _cmd_runner(args: argparse.Namespace) -> int:
    from nas_service.runner import main as runner_main

    return runner_main(list(args.args))


# -- the service and its HTTP client ----------------------------------------------------------
DEFAULT_URL = "http://127.0.0.1:8000"


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"the service (default: DEPTHSCOPE_URL or {DEFAULT_URL})")


class CliError(Exception):
    pass


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One HTTP call; the token comes from DEPTHSCOPE_API_TOKEN. Errors become CliError
    with the service's message."""
    import os

    import httpx

    url = args.url or os.environ.get("DEPTHSCOPE_URL") or DEFAULT_URL
    headers = {}
    token = os.environ.get("DEPTHSCOPE_API_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx.request(
            method, url.rstrip("/") + path, headers=headers, timeout=120, **kwargs
        )
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the service at {url}: {exc}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise CliError(f"{response.status_code}: {message}")
    if response.headers.get("content-type", "").startswith("image/"):
        return response.content
    return response.json()


def _client_command(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            result: int = func(args)
            return result
        except CliError as exc:
            print(f"depthscope {args.command}: error: {exc}", file=sys.stderr)
            return 1

    return run


def _add_service_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the HTTP API (and the local runner)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", help="default: DEPTHSCOPE_DATABASE_URL")
    p.add_argument("--no-runner", action="store_true", help="serve the API only")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("submit", help="submit a job spec (YAML)")
    p.add_argument("spec", help="a YAML job spec, e.g. examples/quick.yaml")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_submit))

    p = sub.add_parser("status", help="list jobs, or show one")
    p.add_argument("job", nargs="?")
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_status))

    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job")
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_cancel))

    p = sub.add_parser("trials", help="a job's trials")
    p.add_argument("job")
    p.add_argument("--state")
    p.add_argument("--variant")
    p.add_argument("--limit", type=int, default=100)
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_trials))

    p = sub.add_parser("pareto", help="the Pareto front over two or more metrics")
    p.add_argument("job")
    p.add_argument("--metrics", default="val_loss,train_memory_bytes")
    p.add_argument("--variant")
    p.add_argument("--plot", help="write a PNG of the first two metrics here")
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_pareto))

    p = sub.add_parser("optimum", help="the loss-optimal d_model/L per variant")
    p.add_argument("job")
    p.add_argument("--plot", help="write a PNG of loss versus d_model/L here")
    _add_client_args(p)
    p.set_defaults(func=_client_command(_cmd_optimum))


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


def _read_spec(path: str) -> dict[str, Any]:
    """The spec file's mapping, read as the service reads one (`spec.read_spec_data`: a size
    cap, no YAML anchors or aliases); a refusal is a `CliError` naming the reason."""
    from nas_service.spec import SpecError, read_spec_data

    try:
        return read_spec_data(path)
    except SpecError as exc:
        raise CliError(str(exc)) from None


def _cmd_submit(args: argparse.Namespace) -> int:
    data = _read_spec(args.spec)
    job = _request(args, "POST", "/v1/jobs", json=data)
    print(f"submitted job {job['id']} ({job['name']}, {job['n_trials']} trials)")
    if args.wait:
        job = _follow(args, job["id"])
        print(f"job {job['id']}: {job['status']}")
        return 0 if job["status"] == "completed" else 1
    return 0


def _follow(args: argparse.Namespace, job_id: str) -> dict[str, Any]:
    import time

    from tqdm import tqdm

    job = _request(args, "GET", f"/v1/jobs/{job_id}")
    bar = tqdm(total=job["n_trials"], unit="trial", file=sys.stderr)
    while True:
        job = _request(args, "GET", f"/v1/jobs/{job_id}")
        _request(args, "GET", "/v1/health")  # a dead runner shows here (503), not as a hang
        p, c = job["progress"], job["compute"]
        bar.n = p["counted"]
        bar.set_postfix(
            running=p["running"], pruned=p["pruned"], compute=f"{c['fraction']:.0%}", refresh=False
        )
        bar.refresh()
        if job["status"] not in ("pending", "running"):
            bar.close()
            return dict(job)
        time.sleep(2)


def _cmd_status(args: argparse.Namespace) -> int:
    if args.job:
        job = _request(args, "GET", f"/v1/jobs/{args.job}")
        p, c = job["progress"], job["compute"]
        eta = f"{job['eta_s']:.0f}s" if job["eta_s"] is not None else "-"
        print(f"{job['id']}  {job['name']}  {job['status']}")
        print(
            f"trials {p['counted']}/{job['n_trials']} (completed {p['completed']}, running "
            f"{p['running']}, pruned {p['pruned']}, infeasible {p['infeasible']}, failed "
            f"{p['failed']}, diverged {p['diverged']})"
        )
        print(
            f"compute {c['spent']:.3g} of {c['budget']:.3g} {c['kind']} "
            f"({c['fraction']:.0%}), ETA {eta}"
        )
        return 0
    jobs = _request(args, "GET", "/v1/jobs")
    print(f"{'id':36}  {'status':10} {'trials':>9}  name")
    for job in jobs["items"]:
        trials = f"{job['progress']['counted']}/{job['n_trials']}"
        print(f"{job['id']:36}  {job['status']:10} {trials:>9}  {job['name']}")
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = _request(args, "POST", f"/v1/jobs/{args.job}/cancel")
    print(f"job {job['id']}: {job['status']}")
    return 0


def _trial_line(t: dict[str, Any], metrics: Sequence[str]) -> str:
    arch = t.get("arch") or {}
    shape = f"L_b={arch.get('n_layers', '?')} d={arch.get('d_model', '?')}"
    if arch.get("block_size"):
        shape += f" S={arch['block_size']}"
    values = "  ".join(
        f"{m}={t['metrics'][m]:.4g}" if isinstance(t["metrics"].get(m), int | float) else f"{m}=-"
        for m in metrics
    )
    return f"{t['number']:>5}  {t['state']:9} {t['variant']:20} {shape:22} {values}"


def _cmd_trials(args: argparse.Namespace) -> int:
    params = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    if args.variant:
        params["variant"] = args.variant
    page = _request(args, "GET", f"/v1/jobs/{args.job}/trials", params=params)
    for t in page["items"]:
        line = _trial_line(t, ["val_loss", "params"])
        print(line + (f"  ({t['outcome']}: {t['reason']})" if t["reason"] else ""))
    print(f"{len(page['items'])} of {page['total']} trials")
    return 0


def _cmd_pareto(args: argparse.Namespace) -> int:
    params = {"metrics": args.metrics}
    if args.variant:
        params["variant"] = args.variant
    out = _request(args, "GET", f"/v1/jobs/{args.job}/pareto", params=params)
    print(
        f"Pareto front over {', '.join(out['metrics'])}: "
        f"{len(out['front'])} of {out['n_candidates']} trials"
    )
    for t in out["front"]:
        print(_trial_line(t, out["metrics"]))
    if args.plot:
        png = _request(args, "GET", f"/v1/jobs/{args.job}/plots/pareto.png", params=params)
        with open(args.plot, "wb") as f:
            f.write(png)
        print(f"wrote {args.plot}")
    return 0


def _cmd_optimum(args: argparse.Namespace) -> int:
    out = _request(args, "GET", f"/v1/jobs/{args.job}/optimum")
    print("loss-optimal d_model/L_b per variant (quadratic fit in ln(d_model/L_b), 90% bootstrap):")
    for f in out["fits"]:
        name = f["variant"] + (
            f" @ {f['budget']:.3g}" if f.get("budget") and len(out["fits"]) > 1 else ""
        )
        best = f.get("best_observed") or {}
        if f["optimum_ratio"] is not None:
            ci = f" [{f['ci_low']:.3g}, {f['ci_high']:.3g}]" if f["ci_low"] is not None else ""
            head = f"{name:24} d_model/L_b ≈ {f['optimum_ratio']:.3g}{ci}"
        else:
            head = f"{name:24} no optimum"
        print(
            f"{head}  ({f['verdict']}; {f['n_shapes']} shapes, {f['n_trials']} trials; "
            f"best observed {best.get('val_loss', float('nan')):.4f} "
            f"at L_b={best.get('n_layers')}, d={best.get('d_model')})"
        )
        if f["message"]:
            print(f"{'':24} {f['message']}")
    if args.plot:
        png = _request(args, "GET", f"/v1/jobs/{args.job}/plots/optimum.png")
        with open(args.plot, "wb") as fh:
            fh.write(png)
        print(f"wrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="depthscope",
        description="Architecture search and cost modelling for Transformer residual connections.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_cost_parser(sub)
    _add_train_parser(sub)
    _add_db_parser(sub)
    _add_runner_parser(sub)
    _add_service_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
