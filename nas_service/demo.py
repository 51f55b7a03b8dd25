"""The README's main job, end to end on embedded defaults: start the service (SQLite file,
local Ray, built-in corpus), submit `examples/quick.yaml`, follow it, print the Pareto front,
the d_model/L optimum per variant and the paired comparison of the variants against the
standard residual, and write the plots to `out/`.

    python -m nas_service.demo [--spec examples/quick.yaml] [--out out]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from nas_service.cli import main as cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_service(out: Path, db_name: str = "demo.db") -> Iterator[str]:
    """`depthscope serve` on a free port of loopback over a fresh SQLite file in `out` (a
    local Ray, the built-in corpus), healthy; yields its URL and stops it afterwards. Its
    log is `out/service.log`. Raises RuntimeError when it does not come up."""
    db = out / db_name
    for stale in out.glob(f"{db_name}*"):
        stale.unlink()
    url = f"http://127.0.0.1:{_free_port()}"
    port = url.rsplit(":", 1)[1]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    log = (out / "service.log").open("w")
    command = [sys.executable, "-m", "nas_service.cli", "serve", "--port", port]
    server = subprocess.Popen(
        [*command, "--database-url", f"sqlite:///{db}"], env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {out / 'service.log'}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/quick.yaml")
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with local_service(out) as url:
            print(f"service up at {url} (database {out / 'demo.db'}, local Ray, built-in corpus)")
            return _main_job(url, Path(args.spec), out)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1


def _fit_text(fit: dict[str, Any]) -> str:
    ratio = f"d_model/L_b ≈ {fit['optimum_ratio']:.0f}"
    if fit.get("ci_low") is not None and fit.get("ci_high") is not None:
        ratio += f" (90% interval {fit['ci_low']:.0f}–{fit['ci_high']:.0f})"
    best = fit.get("best_observed") or {}
    if best:
        ratio += f", best trained shape L_b = {best['n_layers']}, d_model = {best['d_model']}"
    return ratio


def answer_line(fits: list[dict[str, Any]], reference: str = "baseline") -> str:
    """What the job's optima mean for the user, in a sentence or two: the reference's best
    shape at this budget, and where each other variant moves it (deeper and narrower is a
    smaller d_model/L_b), or why no shape can be named."""
    ref = next((f for f in fits if f["variant"] == reference), None)
    if ref is None:
        return f"no fit of {reference}: nothing to compare against"
    if ref["verdict"] != "ok" or ref["optimum_ratio"] is None:
        return (
            f"At this budget the {reference} optimum cannot be placed inside the explored "
            f"shapes ({ref['verdict']}): {ref['message']}"
        )
    lines = [f"At this budget the best {reference} shape is {_fit_text(ref)}."]
    for fit in fits:
        if fit is ref:
            continue
        name = fit["variant"]
        if fit["verdict"] != "ok" or fit["optimum_ratio"] is None:
            lines.append(f"{name}: no interior optimum ({fit['verdict']}).")
            continue
        factor = ref["optimum_ratio"] / fit["optimum_ratio"]
        way = "deeper and narrower" if factor > 1 else "shallower and wider"
        overlap = (
            None not in (fit.get("ci_low"), fit.get("ci_high"), ref.get("ci_low"))
            and fit["ci_low"] <= ref["ci_high"]
            and ref["ci_low"] <= fit["ci_high"]
        )
        verdict = (
            "the intervals overlap, so this job does not separate the two"
            if overlap
            else "the intervals do not overlap"
        )
        lines.append(
            f"{name} moves it {way}, to {_fit_text(fit)} ({max(factor, 1 / factor):.2f}× "
            f"{'smaller' if factor > 1 else 'larger'} d_model/L_b; {verdict})."
        )
    return " ".join(lines)


def _main_job(url: str, spec_path: Path, out: Path) -> int:
    """Submit the spec, follow it, print its answers and write the plots."""
    spec = yaml.safe_load(spec_path.read_text())
    job = httpx.post(f"{url}/v1/jobs", json=spec, timeout=120).json()
    if "id" not in job:
        print(f"submission refused: {job}", file=sys.stderr)
        return 1
    print(f"submitted job {job['id']}: {job['name']}, {job['n_trials']} trials")
    started = time.monotonic()
    from nas_service.cli import _follow  # the same progress bar as `depthscope submit --wait`

    final = _follow(argparse.Namespace(url=url), job["id"])
    print(f"job {final['status']} in {time.monotonic() - started:.0f}s\n")
    if final["status"] != "completed":
        return 1
    cli(["status", job["id"], "--url", url])
    print()
    if len(final["objectives"]) > 1:
        objectives = ",".join(final["objectives"])
        pareto = ["pareto", job["id"], "--metrics", objectives, "--url", url]
        cli([*pareto, "--plot", str(out / "pareto.png")])
        print()
    cli(["optimum", job["id"], "--url", url, "--plot", str(out / "optimum.png")])
    fits = httpx.get(f"{url}/v1/jobs/{job['id']}/optimum", timeout=120).json()["fits"]
    print()
    print(answer_line(fits))
    variants = spec.get("space", {}).get("variants", ["baseline"])
    if len(variants) > 1 and "baseline" in variants:
        print()
        if spec.get("seeds", 1) < 2 and not spec.get("confirm"):
            print(
                "paired comparisons against baseline need at least 2 seeds (this job has "
                "1): see examples/crossover.yaml and docs/study.md"
            )
        else:
            compare = ["compare", job["id"], "--url", url, "--plot", str(out / "compare.png")]
            cli(compare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
