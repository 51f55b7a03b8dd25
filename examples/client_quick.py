"""Submit examples/quick.yaml (or another spec) through the Python client, follow it, and
read the answers.

    .venv/bin/depthscope serve --port 8000 &               # the service, with its runner
    .venv/bin/python examples/client_quick.py [URL [SPEC]]  # the token: DEPTHSCOPE_API_TOKEN

Prints the job's end state, the Pareto front over loss and training memory, the fitted
d_model/L_b optimum per variant and the paired comparison against the baseline (as tables
when pandas is installed: `pip install 'depthscope[pandas]'`)."""

from __future__ import annotations

import sys
from pathlib import Path

from nas_service import Client, ClientError


def main(url: str | None = None, spec: str | Path | None = None) -> int:
    spec = spec or Path(__file__).resolve().parent / "quick.yaml"
    with Client(url) as client:  # url None: DEPTHSCOPE_URL, else http://127.0.0.1:8000
        try:
            job = client.submit(spec)
        except ClientError as exc:  # a refusal: the field and the reason
            print(f"refused: {exc.field}: {exc.message}", file=sys.stderr)
            return 1
        print(f"submitted {job.id}")
        done = job.wait(progress=True)  # a bar on a terminal, quiet elsewhere
        print(f"job {done.id}: {done.status.value}, {done.progress.counted} trials")
        if done.status.value != "completed":
            return 1
        front = job.pareto(["val_loss", "train_memory_bytes"])
        optimum = job.optimum()
        comparison = job.compare("baseline")
        try:
            print(front.to_pandas()[["number", "variant", "metric.val_loss"]])
            print(optimum.to_pandas()[["variant", "verdict", "optimum_ratio", "ci_low", "ci_high"]])
            print(comparison.to_pandas()[["variant", "n_layers", "d_model", "mean", "verdict"]])
        except ImportError:  # no pandas: the typed answers themselves
            for t in front.front:
                print(t.number, t.variant, t.metrics["val_loss"])
            for f in optimum.fits:
                print(f.variant, f.verdict, f.optimum_ratio)
            for p in comparison.pairs:
                print(p.variant, p.n_layers, p.d_model, p.mean, p.verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
