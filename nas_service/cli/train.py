"""`depthscope train`: one candidate trained here, on a fixed budget, with torch.

Its flags are made from declarations: the architecture's from `cost_model.ArchConfig`
(`cli.arch`), the training's from `TrainSpec`'s (`workers.contract.TRAIN_FIELDS`, every field
marked for the command line: its type, default and help), so a field added to the contract
gets its flag here. Both are imported when the flags are built, and torch only when the
command runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nas_service.cli.arch import add_arch_args, arch_values


def add_train_args(p: argparse.ArgumentParser) -> None:
    """The budget (`--flops` or `--tokens`, exactly one) and one flag per `TrainSpec` field
    marked for the command line, with its declared default."""
    from workers.contract import TRAIN_FIELDS

    run = p.add_argument_group("training", "the fields of workers.contract.TrainSpec")
    budget = run.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=float, help="training FLOPs budget (e.g. 3e13)")
    budget.add_argument("--tokens", type=int, help="training tokens budget")
    for f in TRAIN_FIELDS.values():
        if not f.cli:
            continue
        text = f.help + (f" ({' | '.join(f.choices)})" if f.choices else "")
        if f.kind is bool:
            run.add_argument(f.flag, action="store_true", default=f.default, help=text)
            continue
        if f.default is not None:
            text += f" (default: {f.default})"
        run.add_argument(f.flag, type=f.kind, default=f.default, help=text)


def train_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainSpec` fields the flags set (the budget included; not the architecture)."""
    from workers.contract import TRAIN_FIELDS

    fields = {f.name: getattr(args, f.name) for f in TRAIN_FIELDS.values() if f.cli}
    return fields | {"budget_flops": args.flops, "budget_tokens": args.tokens}


def add_parser(sub: Any, flags: bool) -> None:
    """The `train` command; `flags=False` leaves out the architecture and training flags
    (they import the cost model) for a run of another command."""
    p = sub.add_parser(
        "train",
        help="train one candidate on a fixed budget",
        description="Train one architecture for exactly its budget (FLOPs or tokens) and "
        "print the result. Progress goes to stderr.",
    )
    if flags:
        add_arch_args(p, many_variants=False)
        add_train_args(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from cost_model import ArchConfig, CostInputError

    try:
        arch = ArchConfig(**arch_values(args))  # before torch loads: a bad flag fails fast
    except CostInputError as exc:
        print(f"depthscope train: error: {exc}", file=sys.stderr)
        return 2
    from workers.contract import TrainSpec
    from workers.data import CorpusError
    from workers.train import train

    try:
        spec = TrainSpec(arch=arch, **train_values(args))
        bar = None
        if not args.quiet:
            from tqdm import tqdm  # type: ignore[import-untyped]

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
