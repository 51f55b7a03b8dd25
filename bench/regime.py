"""The main job's regime, swept through the service itself: where on 2 cores does the loss-
optimal d_model/L_b of the standard residual lie *inside* the explored shapes, with a bounded
90% interval, and the Pareto front of loss against training memory hold several points?

Each regime is the main job's spec (`examples/quick.yaml`) with some fields replaced (the
parameter target, the FLOPs per candidate, the shapes, the sequence, the learning rates);
every regime runs as one job of one local service (`depthscope serve` on a SQLite file, a
local Ray, the built-in corpus), one job at a time, and the table says per regime: its
parameters and training tokens per parameter, the job's wall time, each variant's optimum
(verdict, d_model/L_b, 90% interval), and the size of the front. `--export DIR` writes each
job as a landscape (`DIR/<regime>.json`); `--json FILE` the table with every spec.

    python bench/regime.py [--regimes p30k-25tpp p30k-17tpp ...] [--out out/regime]
        [--export bench/landscapes/regime] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas_service.client import Client  # noqa: E402
from nas_service.demo import local_service  # noqa: E402

BASE = ROOT / "examples" / "quick.yaml"

#: Each regime: the fields of the main job's spec it replaces (dotted paths; n_trials is the
#: grid's size: shapes × variants).
REGIMES: dict[str, dict[str, Any]] = {
    # the main job as it ships, chosen by this sweep: ~34k parameters, 1.4e11 FLOPs (about
    # 15 training tokens per parameter), 5 shapes, each at lr 0.01 and 0.02
    "p30k-25tpp": {},
    # the main job before: ~150k parameters, 4e11 FLOPs (about 3 tokens per parameter)
    "p150k-3tpp": {
        "space.params_target.params": 1.5e5,
        "space.head_dim": 8,
        "space.n_layers": [1, 2, 3, 4, 5, 8],
        "n_trials": 12,
        "budget.flops": 4.0e11,
        "training.seq_len": 64,
        "training.batch_size": 8,
        "tune.lr": [0.003, 0.006],
    },
    # more parameters and compute, one shape deeper
    "p40k-20tpp": {
        "space.params_target.params": 4.0e4,
        "space.n_layers": [1, 2, 3, 4, 6, 8],
        "n_trials": 12,
        "budget.flops": 2.0e11,
    },
    # the main job at less compute
    "p30k-17tpp": {"budget.flops": 1.0e11},
    # the main job at one learning rate shared by every shape: half the runs
    "p30k-25tpp-1lr": {"tune": None, "training.lr": 0.015},
    # a few seconds: what the benchmark's test runs (too few shapes to fit an optimum)
    "smoke": {
        "space.params_target.params": 2.0e4,
        "space.params_target.tolerance": 0.35,
        "space.n_layers": [1, 2],
        "n_trials": 4,
        "budget.flops": 2.0e9,
        "tune": None,
        "training.lr": 0.01,
        "training.n_evals": 2,
        "training.eval_batches": 2,
    },
}


def with_fields(spec: dict[str, Any], fields: dict[str, Any], name: str) -> dict[str, Any]:
    """`spec` with each dotted field replaced (None removes it) and the job named `name`."""
    out = copy.deepcopy(spec)
    for path, value in fields.items():
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    out["name"] = f"regime-{name}"
    return out


def run_regime(url: str, name: str, spec: dict[str, Any], export: Path | None) -> dict[str, Any]:
    """Submit one regime's job, wait for it, and read its answers."""
    with Client(url) as client:
        started = time.monotonic()
        job = client.submit(spec)
        final = job.wait(progress=False)
        wall = time.monotonic() - started
        trials = job.trials(state="complete").items
        optimum = httpx.get(f"{url}/v1/jobs/{job.id}/optimum", timeout=120).json()
        front = httpx.get(
            f"{url}/v1/jobs/{job.id}/pareto",
            params={"metrics": "val_loss,train_memory_bytes"},
            timeout=120,
        ).json()
        if export is not None:
            export.mkdir(parents=True, exist_ok=True)
            landscape = httpx.get(f"{url}/v1/jobs/{job.id}/landscape", timeout=300).json()
            (export / f"{name}.json").write_text(json.dumps(landscape, indent=1) + "\n")
    params = [float(p) for t in trials if (p := t.metrics.get("params")) is not None]
    tokens = [float(r.tokens_seen or 0) for t in trials for r in t.train if r.tokens_seen]
    fits = [
        {
            "variant": f["variant"],
            "verdict": f["verdict"],
            "optimum_ratio": f.get("optimum_ratio"),
            "ci_low": f.get("ci_low"),
            "ci_high": f.get("ci_high"),
            "explored": f.get("explored"),
            "best_ratio": (f.get("best_observed") or {}).get("ratio"),
        }
        for f in optimum["fits"]
    ]
    p, t = statistics.median(params), statistics.median(tokens)
    return {
        "regime": name,
        "job": job.id,
        "status": final.status,
        "spec": spec,
        "wall_s": wall,
        "params": p,
        "tokens_per_run": t,
        "tokens_per_param": t / p,
        "runs": len([r for tr in trials for r in tr.train]),
        "fits": fits,
        "front": len(front["front"]),
    }


def _fit_text(fit: dict[str, Any]) -> str:
    low, high = fit["ci_low"], fit["ci_high"]
    where = f"{fit['optimum_ratio']:.0f}" if fit["optimum_ratio"] else "-"
    band = f" [{low:.0f}, {high:.0f}]" if low is not None and high is not None else ""
    return f"{fit['variant']}: {fit['verdict']} {where}{band}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = [r for r in REGIMES if r != "smoke"]
    parser.add_argument("--regimes", nargs="+", default=default, choices=list(REGIMES))
    parser.add_argument("--out", type=Path, default=Path("out/regime"))
    parser.add_argument("--export", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(BASE.read_text())
    rows = []
    with local_service(args.out, "regime.db") as url:
        for name in args.regimes:
            row = run_regime(url, name, with_fields(base, REGIMES[name], name), args.export)
            rows.append(row)
            fits = "; ".join(_fit_text(f) for f in row["fits"])
            print(
                f"{name:16} {row['params']:>8.3g} params {row['tokens_per_param']:>5.1f} tok/param "
                f"{row['wall_s']:>5.0f} s  front {row['front']}  {fits}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
