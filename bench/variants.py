"""Training step time and decode time of every residual variant relative to the standard
residual, measured side by side in one run (interleaved rounds, medians).

    python bench/variants.py [--n-layers 8 --d-model 256 --seq-len 256 --batch 8]
                             [--rounds 5 --steps 5 --decode-rounds 3]
                             [--device cpu|cuda] [--default-allocator] [--json FILE]

The training steps run on the C heap as the trainer sets it (`workers.allocator`: freed
memory kept for the next step); `--default-allocator` measures glibc's defaults instead.
Decode: the paths take turns token by token on one set of Transformer weights; the two-phase
schedule (Block AttnRes, and Full AttnRes as its S = 1 case) runs on torch operations
(`depth_attention.OnlineDepth`).

Targets (CPU, L_b = 8, d = 256, T = 256): Block AttnRes (N = 4) ≤ 1.10, Full AttnRes ≤ 1.30,
mHC-lite ≤ 1.30 × the baseline step; two-phase Block AttnRes decode ≤ 1.10 × baseline decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model import ArchConfig
from workers import allocator
from workers.model import DepthscopeLM, build_model

TARGETS = {"block_attnres": 1.10, "full_attnres": 1.30, "mhc_lite": 1.30}
DECODE_TARGET = 1.10


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_timer(cfg: ArchConfig, batch: int, device: torch.device) -> Callable[[int], float]:
    """A closure timing `n` full training steps (forward, backward, AdamW)."""
    model = build_model(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen).to(device)
    y = x.roll(-1, 1)
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )

    def run(n: int) -> float:
        _sync(device)
        start = time.perf_counter()
        for _ in range(n):
            with amp:
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        return (time.perf_counter() - start) / n

    run(1)  # warm-up
    return run


def sharing_weights(cfg: ArchConfig, source: DepthscopeLM) -> DepthscopeLM:
    """A model for `cfg` whose embedding, Transformer blocks, final norm and head are those of
    `source` (the same tensors): two such models differ only in their residual wiring. Two
    models built apart differ by up to ±5% in decode time from where their weights landed in
    memory alone, which would bias a ratio as much as the wiring under test."""
    model = build_model(cfg)
    for name in ("tok_emb", "pos_emb", "blocks", "norm_f", "lm_head"):
        setattr(model, name, getattr(source, name))
    return model


Path_ = tuple[DepthscopeLM, str]  # model, depth schedule


def decode_round(
    paths: dict[str, Path_], x: torch.Tensor, prompt: int, device: torch.device
) -> dict[str, float]:
    """Per-token decode latency of each (model, schedule) after a prompt (KV cache), the
    paths decoding token by token in turn (the order reversed every token), so that drift of
    the machine hits every path alike."""
    caches = {}
    for name, (model, schedule) in paths.items():
        caches[name] = model.new_cache()
        model.step(x[:, :prompt], caches[name], schedule)
    spent = dict.fromkeys(paths, 0.0)
    order = list(paths.items())
    for t in range(prompt, x.shape[1]):
        for name, (model, schedule) in order if t % 2 else reversed(order):
            _sync(device)
            start = time.perf_counter()
            model.step(x[:, t : t + 1], caches[name], schedule)
            _sync(device)
            spent[name] += time.perf_counter() - start
    return {name: total / (x.shape[1] - prompt) for name, total in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=4, help="N for Block AttnRes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timing")
    parser.add_argument(
        "--decode-rounds", type=int, default=3, help="decode rounds per training round"
    )
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--decode-prompt", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int)
    parser.add_argument(
        "--default-allocator",
        action="store_true",
        help="leave the C heap as it is (the trainer tunes it: workers/allocator.py)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    heap = "glibc default"
    if not args.default_allocator and allocator.for_training():
        heap = "tuned for training, as the trainer runs"
    device = torch.device(args.device)
    base = ArchConfig(
        n_layers=args.n_layers, d_model=args.d_model, n_heads=args.n_heads, seq_len=args.seq_len
    )
    block_size = -(-base.n_sublayers // args.blocks)
    variants = {
        "baseline": base,
        "block_attnres": base.replace(variant="block_attnres", block_size=block_size),
        "full_attnres": base.replace(variant="full_attnres"),
        "mhc_lite": base.replace(variant="mhc_lite"),
        "denseformer": base.replace(variant="denseformer"),
    }
    timers = {name: step_timer(cfg, args.batch, device) for name, cfg in variants.items()}
    block = build_model(variants["block_attnres"]).to(device).eval()
    full = sharing_weights(variants["full_attnres"], block).to(device).eval()
    decoders = {
        "baseline": (sharing_weights(base, block).to(device).eval(), "sequential"),
        "block_attnres two_phase": (block, "two_phase"),
        "block_attnres sequential": (block, "sequential"),
        "full_attnres two_phase": (full, "two_phase"),
        "full_attnres sequential": (full, "sequential"),
    }
    gen = torch.Generator().manual_seed(0)
    tokens = (args.decode_batch, args.decode_prompt + args.decode_tokens)
    x_decode = torch.randint(0, base.vocab_size, tokens, generator=gen).to(device)
    decode_round(decoders, x_decode, args.decode_prompt, device)  # warm-up
    train_times: dict[str, list[float]] = {k: [] for k in timers}
    decode_times: dict[str, list[float]] = {k: [] for k in decoders}
    for _ in range(args.rounds):  # interleaved: drift hits every variant alike
        for name, run in timers.items():
            train_times[name].append(run(args.steps))
        for _ in range(args.decode_rounds):
            for name, ms in decode_round(decoders, x_decode, args.decode_prompt, device).items():
                decode_times[name].append(ms)

    def ratios(times: dict[str, list[float]], ref: str) -> dict[str, float]:
        # median over rounds of the per-round ratio: the pairs were measured side by side
        return {
            k: statistics.median(a / b for a, b in zip(v, times[ref], strict=True))
            for k, v in times.items()
        }

    train_ratio = ratios(train_times, "baseline")
    decode_ratio = ratios(decode_times, "baseline")
    two_phase = decode_times["block_attnres two_phase"]
    two_vs_seq = statistics.median(
        a / b for a, b in zip(two_phase, decode_times["block_attnres sequential"], strict=True)
    )
    print(
        f"training step, L_b={args.n_layers} d={args.d_model} T={args.seq_len} batch={args.batch} "
        f"device={device} (median of {args.rounds} interleaved rounds); C heap: {heap}"
    )
    print(f"{'variant':26} {'ms/step':>9} {'vs baseline':>12} {'target':>8}")
    rows = []
    for name in timers:
        ms = statistics.median(train_times[name]) * 1e3
        target = TARGETS.get(name)
        goal = f"≤ {target:.2f}" if target else ""
        print(f"{name:26} {ms:9.1f} {train_ratio[name]:12.3f} {goal:>8}")
        rows.append(
            {
                "kind": "train_step",
                "variant": name,
                "median_ms": ms,
                "ratio": train_ratio[name],
                "target": target,
            }
        )
    print(
        f"\ndecode, batch={args.decode_batch}, {args.decode_tokens} tokens "
        f"after a {args.decode_prompt}-token prompt"
    )
    print(f"{'path':36} {'ms/token':>9} {'vs baseline':>12} {'target':>8}")
    for name in decoders:
        ms = statistics.median(decode_times[name]) * 1e3
        target = DECODE_TARGET if name == "block_attnres two_phase" else None
        goal = f"≤ {target:.2f}" if target else ""
        print(f"{name:36} {ms:9.3f} {decode_ratio[name]:12.3f} {goal:>8}")
        rows.append(
            {
                "kind": "decode",
                "variant": name,
                "median_ms": ms,
                "ratio": decode_ratio[name],
                "target": target,
            }
        )
    print(f"two-phase / sequential (same Block AttnRes model): {two_vs_seq:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "variants",
                    "args": vars(args) | {"json": str(args.json)},
                    "heap": heap,
                    "rows": rows,
                    "two_phase_vs_sequential": two_vs_seq,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
