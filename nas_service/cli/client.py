"""The `depthscope` commands that talk to the service over HTTP: `submit [--wait]`,
`status`, `cancel`, `trials`, `pareto [--plot]`, `optimum [--plot]`. Every call goes through
the package's one transport, `nas_service.cli._request` (looked up when called)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from nas_service import cli
from nas_service.cli import DEFAULT_URL, CliError


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"the service (default: DEPTHSCOPE_URL or {DEFAULT_URL})")


def _client_command(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            result: int = func(args)
            return result
        except CliError as exc:
            print(f"depthscope {args.command}: error: {exc}", file=sys.stderr)
            return 1

    return run


def add_parsers(sub: Any) -> None:
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


def _load_spec(path: str) -> dict[str, Any]:
    """The spec file validated as the service validates one (`spec.load_spec`: a size cap,
    no YAML anchors or aliases, every field checked), as the JSON to send: the fields the
    file gives. A refusal is a `CliError` naming every field and reason."""
    from nas_service.spec import SpecError, load_spec

    try:
        spec = load_spec(path)
    except SpecError as exc:
        raise CliError(str(exc)) from None
    return spec.model_dump(mode="json", exclude_unset=True)


def _cmd_submit(args: argparse.Namespace) -> int:
    data = _load_spec(args.spec)
    job = cli._request(args, "POST", "/v1/jobs", json=data)
    print(f"submitted job {job['id']} ({job['name']}, {job['n_trials']} trials)")
    if args.wait:
        job = _follow(args, job["id"])
        print(f"job {job['id']}: {job['status']}")
        return 0 if job["status"] == "completed" else 1
    return 0


def _follow(args: argparse.Namespace, job_id: str) -> dict[str, Any]:
    import time

    from tqdm import tqdm  # type: ignore[import-untyped]

    job = cli._request(args, "GET", f"/v1/jobs/{job_id}")
    bar = tqdm(total=job["n_trials"], unit="trial", file=sys.stderr)
    while True:
        job = cli._request(args, "GET", f"/v1/jobs/{job_id}")
        cli._request(args, "GET", "/v1/health")  # a dead runner shows here (503), not as a hang
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
        job = cli._request(args, "GET", f"/v1/jobs/{args.job}")
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
    jobs = cli._request(args, "GET", "/v1/jobs")
    print(f"{'id':36}  {'status':10} {'trials':>9}  name")
    for job in jobs["items"]:
        trials = f"{job['progress']['counted']}/{job['n_trials']}"
        print(f"{job['id']:36}  {job['status']:10} {trials:>9}  {job['name']}")
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = cli._request(args, "POST", f"/v1/jobs/{args.job}/cancel")
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
    page = cli._request(args, "GET", f"/v1/jobs/{args.job}/trials", params=params)
    for t in page["items"]:
        line = _trial_line(t, ["val_loss", "params"])
        print(line + (f"  ({t['outcome']}: {t['reason']})" if t["reason"] else ""))
    print(f"{len(page['items'])} of {page['total']} trials")
    return 0


def _cmd_pareto(args: argparse.Namespace) -> int:
    params = {"metrics": args.metrics}
    if args.variant:
        params["variant"] = args.variant
    out = cli._request(args, "GET", f"/v1/jobs/{args.job}/pareto", params=params)
    print(
        f"Pareto front over {', '.join(out['metrics'])}: "
        f"{len(out['front'])} of {out['n_candidates']} trials"
    )
    for t in out["front"]:
        print(_trial_line(t, out["metrics"]))
    if args.plot:
        png = cli._request(args, "GET", f"/v1/jobs/{args.job}/plots/pareto.png", params=params)
        with open(args.plot, "wb") as f:
            f.write(png)
        print(f"wrote {args.plot}")
    return 0


def _cmd_optimum(args: argparse.Namespace) -> int:
    out = cli._request(args, "GET", f"/v1/jobs/{args.job}/optimum")
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
        png = cli._request(args, "GET", f"/v1/jobs/{args.job}/plots/optimum.png")
        with open(args.plot, "wb") as fh:
            fh.write(png)
        print(f"wrote {args.plot}")
    return 0
