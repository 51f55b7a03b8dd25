"""Trainer overhead: the training throughput of `workers.train.train` divided by a bare loop
(same model, same batches, forward + backward + AdamW, no callbacks, no evaluation, no
clipping), side by side in interleaved rounds. The trainer's throughput excludes its
evaluation time (reported separately), so the ratio measures the per-step overhead.

    python bench/trainer.py [--steps 40 --rounds 5] [--json FILE]

Target: ≥ 0.95.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model import ArchConfig
from workers import allocator
from workers.contract import TrainSpec
from workers.data import Corpus, load_corpus
from workers.model import build_model
from workers.train import train


def bare_loop(spec: TrainSpec, corpus: Corpus, steps: int) -> float:
    """Tokens per second of the plainest loop over the same model and batches."""
    torch.manual_seed(spec.seed)
    model = build_model(spec.arch)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    gen = torch.Generator().manual_seed(spec.seed)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = corpus.batch("train", spec.batch_size, spec.arch.seq_len, gen)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * spec.tokens_per_step / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    arch = ArchConfig(
        n_layers=4, d_model=128, n_heads=4, seq_len=128, variant="block_attnres", block_size=2
    )
    spec = TrainSpec(
        arch=arch, budget_tokens=args.steps * 16 * 128, batch_size=16, n_evals=4, eval_batches=4
    )
    corpus = load_corpus()
    allocator.for_training()  # as `train` sets it: the bare loop runs on the same heap
    ours, bare, evals = [], [], []
    for _ in range(args.rounds):
        result = train(spec, corpus=corpus)
        ours.append(result.tokens_per_s)
        evals.append(result.eval_time_s / result.wall_time_s)
        bare.append(bare_loop(spec, corpus, args.steps))
    ratio = statistics.median(a / b for a, b in zip(ours, bare, strict=True))
    print(
        f"trainer overhead, {arch.variant} L_b={arch.n_layers} d={arch.d_model} T={arch.seq_len} "
        f"batch 16, {args.steps} steps, median of {args.rounds} interleaved rounds"
    )
    print(f"{'loop':10} {'tokens/s':>10}")
    print(f"{'bare':10} {statistics.median(bare):10,.0f}")
    print(f"{'trainer':10} {statistics.median(ours):10,.0f}")
    print(
        f"ratio trainer/bare: {ratio:.3f} (target ≥ 0.95); evaluation took "
        f"{statistics.median(evals):.1%} of the trainer's wall time, excluded"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "trainer",
                    "ratio": ratio,
                    "bare_tokens_per_s": bare,
                    "trainer_tokens_per_s": ours,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
