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
