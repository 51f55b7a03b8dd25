"""The crossover study's answer over one or more jobs of the same shapes, seeds and budget
(`docs/study.md`): a follow-up job that widens one variant's training grid joins the first.

    python bench/crossover_joined.py [--url URL --jobs JOB ...] [--landscapes FILE ...]
        [--reference baseline] [--json FILE] [--plot-compare PNG] [--plot-optimum PNG]

The jobs are read from a running service (`--url`, `--jobs`) or from their landscape files
(`depthscope export JOB --out FILE`, as recorded in `bench/landscapes/`), or both.

Per (variant, depth) the setting is chosen, over every job's trials of that shape, by the
lowest mean loss on the tuning seeds (each trial's `settings` table), exactly as one job with
the union of the grids would choose it; the shape is then scored on the chosen setting's
confirmation runs (the trial that chose it trained them). Each variant is compared with the
reference at every depth seed by seed on the confirmation seeds they share (seed k: the same
batches and initial Transformer in every job), with the service's paired Student t interval
(`results.analysis.paired_interval`, 95%), and each variant's optimum d_model/L_b is fitted on
its confirmed losses (`search.optimum.fit_optimum`, 90%). A chosen setting at an end of the
joined grid of an axis is flagged ("widen"), as `depthscope sensitivity` flags it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nas_service.results.analysis import paired_interval, plot_compare, plot_optimum
from nas_service.search.optimum import Floats, fit_optimum


def _service_trials(url: str, job: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = httpx.get(
            f"{url}/v1/jobs/{job}/trials", params={"limit": 500, "offset": len(out)}, timeout=60
        ).json()
        out += page["items"]
        if len(out) >= page["total"] or not page["items"]:
            return out


def _landscape_trials(path: Path) -> tuple[str, list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    if data.get("format") != "depthscope-landscape":
        raise SystemExit(f"{path}: not a depthscope landscape file")
    return data["job"]["id"], data["trials"]


def _label(trial: dict[str, Any]) -> str:
    arch = trial["arch"]
    size = arch.get("block_size")
    return f"{arch['variant']}/S={size}" if size else str(arch["variant"])


def shapes(trials: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (variant label, n_layers): the chosen setting over every trial of the shape, its
    confirmation (seeds and losses), the settings tried and the d_model."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for t in trials:
        if t["state"] == "complete" and t.get("confirm") and not t.get("lost"):
            grouped.setdefault((_label(t), int(t["arch"]["n_layers"])), []).append(t)
    out = {}
    for key, group in grouped.items():
        tried = [(s["mean"], s["setting"], t) for t in group for s in t["settings"]]
        mean, setting, chooser = min(tried, key=lambda x: x[0])
        confirm = chooser["confirm"]
        assert confirm["setting"] == setting, "a trial confirms its own best setting"
        out[key] = {
            "variant": key[0],
            "n_layers": key[1],
            "d_model": chooser["arch"]["d_model"],
            "setting": setting,
            "tuning_mean": mean,
            "tried": sorted({json.dumps(s, sort_keys=True) for _, s, _ in tried}),
            "seeds": confirm["seeds"],
            "losses": confirm["losses"],
            "confirmed_mean": confirm["mean"],
        }
    return out


def _edges(rows: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """Where a shape's chosen value of a tuned axis is the largest or smallest its variant
    tried."""
    flags = []
    for (variant, n_layers), row in sorted(rows.items()):
        tried = [json.loads(s) for s in row["tried"]]
        for axis in ("lr", "depth_lr_mult"):
            values = sorted({s[axis] for s in tried})
            if len(values) < 2:
                continue
            chosen = row["setting"][axis]
            if chosen in (values[0], values[-1]):
                side = "high" if chosen == values[-1] else "low"
                flags.append(f"{variant} L_b={n_layers}: {axis} {chosen:g} at the {side} end")
    return flags


def answer(trials: list[dict[str, Any]], jobs: list[str], reference: str) -> dict[str, Any]:
    """The joined answer over `trials`, every trial of the named `jobs`."""
    rows = shapes(trials)
    variants = sorted({v for v, _ in rows} - {reference})
    pairs = []
    for variant in variants:
        for n_layers in sorted(n for v, n in rows if v == variant):
            ref, row = rows.get((reference, n_layers)), rows[(variant, n_layers)]
            if ref is None:
                continue
            ref_by_seed = dict(zip(ref["seeds"], ref["losses"], strict=True))
            seeds = [s for s in row["seeds"] if s in ref_by_seed]
            by_seed = dict(zip(row["seeds"], row["losses"], strict=True))
            diffs = [by_seed[s] - ref_by_seed[s] for s in seeds]
            mean, lo, hi = paired_interval(diffs)
            verdict = "better" if hi < 0 else "worse" if lo > 0 else "no difference"
            pairs.append(
                {
                    "variant": variant,
                    "n_layers": n_layers,
                    "d_model": row["d_model"],
                    "seeds": seeds,
                    "differences": diffs,
                    "mean": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "half_width": (hi - lo) / 2,
                    "sd": statistics.stdev(diffs),
                    "verdict": verdict,
                    "setting": row["setting"],
                    "reference_setting": ref["setting"],
                }
            )
    optima = {}
    for variant in sorted({v for v, _ in rows}):
        mine = [r for (v, _), r in rows.items() if v == variant]
        fit = fit_optimum(
            variant,
            [r["d_model"] / r["n_layers"] for r in mine],
            [r["confirmed_mean"] for r in mine],
        )
        optima[variant] = fit.as_dict()
    return {
        "jobs": jobs,
        "reference": reference,
        "shapes": [rows[k] for k in sorted(rows)],
        "pairs": pairs,
        "optima": optima,
        "widen": _edges(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--jobs", nargs="+", default=[])
    parser.add_argument("--landscapes", nargs="+", type=Path, default=[])
    parser.add_argument("--reference", default="baseline")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot-compare", type=Path, help="the paired differences by depth")
    parser.add_argument("--plot-optimum", type=Path, help="confirmed loss against d_model/L_b")
    args = parser.parse_args(argv)
    if not args.jobs and not args.landscapes:
        parser.error("name at least one job (--jobs) or landscape file (--landscapes)")
    jobs, trials = list(args.jobs), [t for job in args.jobs for t in _service_trials(args.url, job)]
    for path in args.landscapes:
        job, recorded = _landscape_trials(path)
        jobs.append(job)
        trials += recorded
    result = answer(trials, jobs, args.reference)
    print("shape                 chosen setting (tuning mean)        confirmed mean ± sd")
    for r in result["shapes"]:
        s = r["setting"]
        sd = statistics.stdev(r["losses"])
        print(
            f"{r['variant']:<16} L_b={r['n_layers']:<2} lr={s['lr']:<6g} "
            f"dlm={s['depth_lr_mult']:<4g} ({r['tuning_mean']:.3f})   "
            f"{r['confirmed_mean']:.3f} ± {sd:.3f} ({len(r['losses'])} seeds)"
        )
    print(f"\nvariant − {result['reference']}, paired over the confirmation seeds (95%):")
    for p in result["pairs"]:
        print(
            f"{p['variant']:<16} L_b={p['n_layers']:<2} d={p['d_model']:<3} "
            f"{p['mean']:+.4f} [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}] "
            f"±{p['half_width']:.4f} sd {p['sd']:.4f}  {p['verdict']}"
        )
    print("\noptimum d_model/L_b (90%):")
    for variant, fit in result["optima"].items():
        lo, hi = fit["ci_low"], fit["ci_high"]
        interval = f"[{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else "unbounded"
        ratio = fit["optimum_ratio"]
        print(
            f"{variant:<16} {fit['verdict']:<8} "
            f"{ratio if ratio is None else f'{ratio:.3g}'} {interval} {fit['message']}"
        )
    print("\nwiden:", "; ".join(result["widen"]) or "none")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot_compare:
        plot_compare(_compare_answer(result), str(args.plot_compare))
    if args.plot_optimum:
        data: dict[str, tuple[Floats, Floats]] = {
            v: (
                [r["d_model"] / r["n_layers"] for r in result["shapes"] if r["variant"] == v],
                [r["confirmed_mean"] for r in result["shapes"] if r["variant"] == v],
            )
            for v in result["optima"]
        }
        plot_optimum(
            data, {v: fit_optimum(v, *xy) for v, xy in data.items()}, str(args.plot_optimum)
        )
    return 0


def _compare_answer(result: dict[str, Any]) -> dict[str, Any]:
    """The joined pairs in the shape of the service's `compare` answer, for its plot."""
    variants = sorted({p["variant"] for p in result["pairs"]})
    return {
        "reference": result["reference"],
        "level": 0.95,
        "crossover": [
            {
                "variant": v,
                "by_depth": [p for p in result["pairs"] if p["variant"] == v],
                "crossover_sublayers": None,
            }
            for v in variants
        ],
    }


if __name__ == "__main__":
    raise SystemExit(main())
