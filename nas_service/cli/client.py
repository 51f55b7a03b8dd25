"""The `depthscope` commands that talk to the service over HTTP: `submit [--wait]`,
`status`, `cancel`, `trials`, `pareto [--plot]`, `optimum [--plot]`, `compare [--plot]`,
`sensitivity`, `export --out` (the job as a landscape), `calibration [--scope] [--plot]`
(the roofline against the measured step times). Every call goes through the package's one
transport, `nas_service.cli.transport._request` (looked up when called), which sends through
the Python client's (`nas_service.client.Client.request`); `submit --wait` follows the job with
`Job.wait`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from nas_service.cli import transport
from nas_service.cli.transport import CliError, CliUsageError
from nas_service.client import DEFAULT_URL


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"the service (default: DEPTHSCOPE_URL or {DEFAULT_URL})")


def _client_command(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            result: int = func(args)
            return result
        except CliError as exc:
            print(f"depthscope {args.command}: error: {exc}", file=sys.stderr)
            return exc.code

    return run


def add_parsers(sub: Any) -> None:
    made: list[argparse.ArgumentParser] = []

    def command(name: str, help: str, func: Any, job: bool = True) -> argparse.ArgumentParser:
        """The subcommand `name` running `func` (its `CliError`s reported), with a job's id
        as its first argument where `job`; the client's own arguments come after its own."""
        p: argparse.ArgumentParser = sub.add_parser(name, help=help)
        if job:
            p.add_argument("job")
        p.set_defaults(func=_client_command(func))
        made.append(p)
        return p

    p = command("submit", "submit a job spec (YAML)", _cmd_submit, job=False)
    p.add_argument("spec", help="a YAML job spec, e.g. examples/quick.yaml")
    p.add_argument("--wait", action="store_true", help="follow the job to its end")

    p = command("status", "list jobs, or show one", _cmd_status, job=False)
    p.add_argument("job", nargs="?")

    command("cancel", "cancel a job", _cmd_cancel)

    p = command("trials", "a job's trials", _cmd_trials)
    p.add_argument("--state")
    p.add_argument("--variant")
    p.add_argument("--limit", type=int, default=100)

    p = command("pareto", "the Pareto front over two or more metrics", _cmd_pareto)
    p.add_argument("--metrics", default="val_loss,train_memory_bytes")
    p.add_argument("--variant")
    p.add_argument("--plot", help="write a PNG of the first two metrics here")

    p = command("optimum", "the loss-optimal d_model/L per variant", _cmd_optimum)
    p.add_argument("--plot", help="write a PNG of loss versus d_model/L here")
    p.add_argument(
        "--raw", action="store_true", help="fit every trial, not each shape's best setting"
    )

    p = command("compare", "paired comparison of each variant against a reference", _cmd_compare)
    p.add_argument("--reference", default="baseline", help="a variant of the job")
    p.add_argument("--level", type=float, default=0.95, help="the interval's level")
    p.add_argument("--plot", help="write a PNG of the difference against depth here")

    p = command("export", "write a job as a landscape file (JSON)", _cmd_export)
    p.add_argument("--out", required=True, help="the file to write")

    command("sensitivity", "loss against each training axis, per shape", _cmd_sensitivity)

    p = command(
        "calibration",
        "the roofline against the measured step times, per device kind",
        _cmd_calibration,
    )
    p.add_argument(
        "--scope",
        choices=("job", "cluster"),
        default="job",
        help="fit this job's trials, or every recent job's of its cluster",
    )
    p.add_argument("--plot", help="write a PNG of predicted versus measured step time here")

    for made_parser in made:
        _add_client_args(made_parser)


def _save_plot(args: argparse.Namespace, name: str, params: dict[str, Any]) -> None:
    """The job's plot `name` (`/v1/jobs/{job}/plots/{name}.png`) written to `--plot`."""
    png = transport._request(args, "GET", f"/v1/jobs/{args.job}/plots/{name}.png", params=params)
    with open(args.plot, "wb") as fh:
        fh.write(png)
    print(f"wrote {args.plot}")


def _load_spec(path: str) -> dict[str, Any]:
    """The spec file validated as the service validates one (`spec.load_spec`: a size cap,
    no YAML anchors or aliases, every field checked), as the JSON to send: the fields the
    file gives. A refusal is a `CliError` naming every field and reason; a path that is
    missing or not a regular file (a FIFO is never waited on) a `CliUsageError` (exit 2)."""
    from nas_service.spec import SpecError, SpecFileError, load_spec

    try:
        spec = load_spec(path)
    except SpecFileError as exc:
        raise CliUsageError(str(exc)) from None
    except SpecError as exc:
        raise CliError(str(exc)) from None
    return spec.model_dump(mode="json", exclude_unset=True)


def _cmd_submit(args: argparse.Namespace) -> int:
    data = _load_spec(args.spec)
    job = transport._request(args, "POST", "/v1/jobs", json=data)
    print(f"submitted job {job['id']} ({job['name']}, {job['n_trials']} trials)")
    if args.wait:
        job = _follow(args, job["id"])
        print(f"job {job['id']}: {job['status']}")
        return 0 if job["status"] == "completed" else 1
    return 0


def _follow(args: argparse.Namespace, job_id: str) -> dict[str, Any]:
    """The job followed to its end by the Python client (`Job.wait`: a bar on a terminal,
    the health read at each poll), as JSON."""
    from nas_service.client import Client, ClientError

    try:
        with Client(args.url) as client:
            job = client.job(job_id).wait(progress=True)
    except ClientError as exc:
        raise CliError(str(exc)) from None
    return dict(job.model_dump(mode="json"))


def _cmd_status(args: argparse.Namespace) -> int:
    if args.job:
        job = transport._request(args, "GET", f"/v1/jobs/{args.job}")
        p, c = job["progress"], job["compute"]
        eta = f"{job['eta_s']:.0f}s" if job["eta_s"] is not None else "-"
        print(f"{job['id']}  {job['name']}  {job['status']}")
        print(
            f"trials {p['counted']}/{job['n_trials']} (completed {p['completed']}, running "
            f"{p['running']}, pruned {p['pruned']}, infeasible {p['infeasible']}, failed "
            f"{p['failed']}, diverged {p['diverged']}); training runs "
            f"{p.get('runs_done', 0)}/{p.get('runs_total', 0)}"
        )
        for r in p.get("rungs") or []:  # a multi-fidelity job: where its trials are
            print(
                f"rung {r['rung'] + 1} ({r['fraction']:.0%} of the budget): reached "
                f"{r['reached']}, training {r['training']}, waiting {r['waiting']}, "
                f"promoted {r['promoted']}"
            )
        fidelity = (job.get("spec") or {}).get("fidelity") or {}
        if fidelity.get("reuse") == "retrain":
            print("each promotion retrains from scratch (its compute is counted)")
        planned = " (expected by the rungs)" if p.get("rungs") else ""
        print(
            f"compute {c['spent']:.3g} of {c['budget']:.3g}{planned} {c['kind']} "
            f"({c['fraction']:.0%}), ETA {eta}"
        )
        return 0
    jobs = transport._request(args, "GET", "/v1/jobs")
    print(f"{'id':36}  {'status':10} {'trials':>9}  name")
    for job in jobs["items"]:
        trials = f"{job['progress']['counted']}/{job['n_trials']}"
        print(f"{job['id']:36}  {job['status']:10} {trials:>9}  {job['name']}")
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = transport._request(args, "POST", f"/v1/jobs/{args.job}/cancel")
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
    line = f"{t['number']:>5}  {t['state']:9} {t['variant']:20} {shape:22} {values}"
    tried = [e.get("setting", {}) for e in t.get("settings") or []]
    varied = [k for k in t.get("setting") or {} if len({str(s.get(k)) for s in tried}) > 1]
    if varied:  # the trial's best of several settings: which one
        line += "  at " + " ".join(f"{k}={t['setting'][k]:g}" for k in varied)
    rungs = t.get("rungs") or []
    if rungs:  # multi-fidelity: the rungs it trained, its loss at each
        steps = " ".join(f"r{r['rung'] + 1}={r['loss']:.4f}" for r in rungs if r.get("loss"))
        wait = f", waiting at rung {t['waiting'] + 1}" if t.get("waiting") is not None else ""
        line += f"  [{steps}{wait}]"
    return line


def _cmd_trials(args: argparse.Namespace) -> int:
    params = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    if args.variant:
        params["variant"] = args.variant
    page = transport._request(args, "GET", f"/v1/jobs/{args.job}/trials", params=params)
    for t in page["items"]:
        line = _trial_line(t, ["val_loss", "params"])
        print(line + (f"  ({t['outcome']}: {t['reason']})" if t["reason"] else ""))
    print(f"{len(page['items'])} of {page['total']} trials")
    return 0


def _cmd_pareto(args: argparse.Namespace) -> int:
    params = {"metrics": args.metrics}
    if args.variant:
        params["variant"] = args.variant
    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/pareto", params=params)
    print(
        f"Pareto front over {', '.join(out['metrics'])}: "
        f"{len(out['front'])} of {out['n_candidates']} trials"
    )
    for t in out["front"]:
        print(_trial_line(t, out["metrics"]))
    if len(out["front"]) == 1 and out["n_candidates"] > 1:
        print(
            "one trial is at least as good as every other on every metric: in this space "
            f"nothing trades {out['metrics'][0]} for {', '.join(out['metrics'][1:])} (a front "
            "of several points needs shapes whose lower loss costs more, e.g. where depth pays)"
        )
    if args.plot:
        _save_plot(args, "pareto", params)
    return 0


def _cmd_optimum(args: argparse.Namespace) -> int:
    params = {"profile": "false"} if args.raw else {}
    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/optimum", params=params)
    view = "every trial" if args.raw else "each shape at its best training setting"
    print(
        "loss-optimal d_model/L_b per variant (quadratic fit in ln(d_model/L_b), 90% interval "
        f"from the fit; {view}):"
    )
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
        if f.get("move_message"):
            print(f"{'':24} {f['move_message']}")
    if args.plot:
        _save_plot(args, "optimum", params)
    return 0


def _interval(mean: float | None, low: float | None, high: float | None) -> str:
    if mean is None:
        return "-"
    if low is None or high is None:
        return f"{mean:+.4f}"
    return f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"


def _cmd_compare(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"reference": args.reference, "level": args.level}
    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/compare", params=params)
    print(
        f"paired comparison against {out['reference']} (loss difference, variant − reference; "
        f"negative is better; {out['level']:.0%} interval: {out['method']}):"
    )
    print(f"{'variant':22} {'L_b':>4} {'d':>5} {'seeds':>5}  {'difference':34} verdict")
    for pair in out["pairs"]:
        interval = _interval(pair["mean"], pair["ci_low"], pair["ci_high"])
        print(
            f"{pair['variant']:22} {pair['n_layers']:>4} {pair['d_model']:>5} "
            f"{len(pair['seeds']):>5}  {interval:34} {pair['verdict']}"
        )
    for cross in out["crossover"]:
        print(f"{cross['variant']}: {cross['message']}")
    seeds = sorted({k for pair in out["pairs"] for k in pair["seeds"]})
    if out.get("scored_on") == "confirmation":
        print(f"scored on held-out confirmation seeds {', '.join(map(str, seeds))}")
    elif out.get("scored_on"):
        print(f"scored on the seeds that chose each setting ({out['scored_on']})")
    if out.get("warning"):
        print(f"warning: {out['warning']}")
    if out["unmatched"]:
        print(f"{len(out['unmatched'])} shapes without a match in the other variant")
    if args.plot:
        _save_plot(args, "compare", params)
    return 0


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/sensitivity")
    for v in out["variants"]:
        print(f"{v['variant']}:")
        for axis in v["axes"]:
            print(f"  {axis['axis']} over {', '.join(f'{x:g}' for x in axis['values'])}:")
            for curve in axis["curves"]:
                points = "  ".join(
                    f"{x:g}→{y:.4f}" if y is not None else f"{x:g}→-" for x, y in curve["points"]
                )
                edge = f"  (best at the {curve['at_edge']} edge)" if curve["at_edge"] else ""
                best = f"{curve['best']:g}" if curve["best"] is not None else "-"
                print(
                    f"    L_b={curve['n_layers']:<3} d={curve['d_model']:<5} best {best:8}"
                    f" {points}{edge}"
                )
        for flag in v["flags"]:
            print(f"  {flag}")
    if not out["variants"]:
        print("no training axis took more than one value in this job")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/landscape")
    with open(args.out, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
    runs = sum(len(t["train"]) for t in out["trials"])
    print(
        f"wrote {args.out}: job {out['job']['name']} ({out['job']['status']}), "
        f"{len(out['trials'])} trials, {runs} training runs"
    )
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _cmd_calibration(args: argparse.Namespace) -> int:
    params = {"scope": args.scope}
    out = transport._request(args, "GET", f"/v1/jobs/{args.job}/calibration", params=params)
    print(
        f"calibration of the roofline ({out['scope']}, cluster {out['cluster']}): {out['message']}"
    )
    for g in out["groups"]:
        print(
            f"{g['device_kind']} (preset {g['hardware']}, {g['dtype']}: "
            f"{g['peak_flops']:.3g} FLOP/s, {g['memory_bandwidth']:.3g} B/s): "
            f"{g['trials']} measured trials"
            + ("" if g["ready"] else f", {g['needed']} more needed for a fit")
        )
        model, cv = g["model"], g["cross_validation"]
        if model is not None:
            print(
                f"  t = {model['compute_factor']:.3g}·compute_s + "
                f"{model['memory_factor']:.3g}·memory_s + {model['overhead_s']:.3g} s  "
                f"(achieved: {_pct(model['compute_efficiency'])} of peak FLOP/s, "
                f"{_pct(model['bandwidth_efficiency'])} of bandwidth)"
            )
        if cv is not None:
            print(
                f"  relative error, {cv['folds']}-fold cross-validated: calibrated median "
                f"{_pct(cv['median_error'])}, p90 {_pct(cv['p90_error'])}; raw roofline "
                f"median {_pct(cv['roofline_median_error'])}, p90 {_pct(cv['roofline_p90_error'])}"
            )
        for m in g["memory"]:
            print(
                f"  memory ({m['memory_kind']}, {m['trials']} trials), measured / analytic: "
                f"{_ratio_text(m['median_ratio'])} in all, activations "
                f"{_ratio_text(m['median_activation_ratio'])}, state "
                f"{_ratio_text(m['median_state_ratio'])}"
            )
    if out["skipped"]:
        print(f"{len(out['skipped'])} trials not compared: {out['skipped'][0]['reason']}")
    if args.plot:
        _save_plot(args, "calibration", params)
    return 0


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
