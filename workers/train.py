"""The fixed-budget trainer: one `TrainSpec` in, one `TrainResult` out.

Under a FLOPs budget the number of training tokens comes from `cost_model.budget`, so every
candidate of a search spends the compute it was given (to within one optimizer step: the run
trains floor(tokens / tokens-per-step) whole steps and reports the FLOPs it spent). Validation
losses are reported to a callback at a fixed cadence; the callback may stop the run (this is
what pruning uses). A NaN or exploding loss ends the run as `diverged`, never as an exception.

Paired seeds: the training batches come from a generator of their own seeded by
`TrainSpec.seed` (`train_batches`), and the model's common parameters are initialised
independently of its residual wiring (`DepthscopeLM.reset_parameters`), so two variants of the
same shape trained with the same seed see the same batches in the same order from the same
initial Transformer.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch

from cost_model import param_count
from cost_model.flops import training_flops_per_token
from workers import allocator
from workers.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from workers.contract import (
    EvalPoint,
    TrainResult,
    TrainSpec,
    TrainSpecError,
)
from workers.data import Corpus, load_corpus
from workers.measure import SavedTensors, device_name, resolve_device, rss_bytes, state_bytes
from workers.model import DepthscopeLM, build_model
from workers.store import ArtifactStore, CheckpointError, check_key

log = logging.getLogger(__name__)


def lr_at(spec: TrainSpec, step: int, total: int) -> float:
    """Learning rate at `step` (0-based) of `total` steps."""
    warmup = max(1, int(spec.warmup_frac * total)) if spec.warmup_frac > 0 else 0
    floor = spec.min_lr_ratio * spec.lr
    if step < warmup:
        return spec.lr * (step + 1) / warmup
    if spec.schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return floor + (spec.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    decay_start = total - int(spec.decay_frac * total)
    if step < decay_start:
        return spec.lr
    progress = (step - decay_start + 1) / max(1, total - decay_start)
    return spec.lr + (floor - spec.lr) * min(1.0, progress)


#: The optimizer's parameter groups, in this order.
GROUPS = ("decay", "no_decay", "depth_mixing")


def parameter_groups(model: DepthscopeLM) -> dict[str, list[str]]:
    """Every parameter name of `model.named_parameters()` in exactly one of `GROUPS`:

    - `depth_mixing`: the residual wiring's parameters (`model.depth_mixing_parameter_names()`:
      AttnRes pseudo-queries, key-norm gains and input projections, mHC-lite's coefficient
      projections, biases and gates, DenseFormer's weights), whatever their shape;
    - `decay`: the other matrices (every tensor of two or more dimensions: projections,
      embeddings, an untied head);
    - `no_decay`: the other vectors (norm gains, biases).

    Every group is listed (the baseline's `depth_mixing` is empty), names in model order."""
    depth = set(model.depth_mixing_parameter_names())
    groups: dict[str, list[str]] = {name: [] for name in GROUPS}
    for name, p in model.named_parameters():
        group = "depth_mixing" if name in depth else "decay" if p.dim() >= 2 else "no_decay"
        groups[group].append(name)
    missing = depth - set(groups["depth_mixing"])
    if missing:  # a mixer declaring something that is not a parameter of the model
        raise ValueError(f"depth-mixing parameters not in the model: {sorted(missing)}")
    return groups


def make_optimizer(model: DepthscopeLM, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW (β1, β2 from `spec`) over the non-empty `parameter_groups`, each with its
    `"name"`, its `"weight_decay"` (`spec.weight_decay` for `decay`, 0 for `no_decay` and
    `depth_mixing`) and its `"lr_mult"` (1, and `spec.depth_lr_mult` for `depth_mixing`):
    at step t a group's learning rate is `lr_at(spec, t, steps) · lr_mult`
    (`set_learning_rates`). With `depth_lr_mult` 0 the depth-mixing parameters never move
    (AdamW's update lr·(m̂/(√v̂+ε) + λ·θ) is 0)."""
    params = dict(model.named_parameters())
    settings = {
        "decay": (spec.weight_decay, 1.0),
        "no_decay": (0.0, 1.0),
        "depth_mixing": (0.0, spec.depth_lr_mult),
    }
    groups = [
        {
            "name": name,
            "params": [params[n] for n in names],
            "weight_decay": settings[name][0],
            "lr_mult": settings[name][1],
            "lr": spec.lr * settings[name][1],
        }
        for name, names in parameter_groups(model).items()
        if names
    ]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2))


def set_learning_rates(opt: torch.optim.Optimizer, spec: TrainSpec, step: int, total: int) -> None:
    """Every group's learning rate for `step` of `total`: `lr_at(spec, step, total)` times the
    group's `"lr_mult"`."""
    lr = lr_at(spec, step, total)
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_mult"]


def initial_model(spec: TrainSpec) -> DepthscopeLM:
    """The model of `spec.arch` as it starts training: built (on the CPU) right after
    `torch.manual_seed(spec.seed)`. Its common parameters do not depend on the variant (see
    `DepthscopeLM.reset_parameters`)."""
    torch.manual_seed(spec.seed)
    return build_model(spec.arch)


def batch_generator(spec: TrainSpec) -> torch.Generator:
    """The CPU generator the training batches of `spec` are drawn with, seeded by `spec.seed`
    (its state after k batches is what a checkpoint at step k keeps)."""
    return torch.Generator().manual_seed(spec.seed)


def train_batches(
    corpus: Corpus, spec: TrainSpec, generator: torch.Generator | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The training batches of `spec`, in order, without end: `corpus.batch` from a CPU
    generator of their own seeded by `spec.seed`, so they depend on the corpus, the seed, the
    batch size and the sequence length only (never on the model or its variant).

    `generator`: draw with this one instead (`batch_generator(spec)`, perhaps set to a
    checkpoint's state: the stream then goes on exactly where that run's was)."""
    gen = generator if generator is not None else batch_generator(spec)
    while True:
        yield corpus.batch("train", spec.batch_size, spec.arch.seq_len, gen)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> float:
    """Mean validation cross-entropy over fixed batches (nats per token)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for x, y in batches:
        with _autocast(device):
            _, loss = model(x.to(device), y.to(device))
        total += float(loss)
    model.train(was_training)
    return total / len(batches)


def _autocast(device: torch.device) -> Any:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


StopCallback = Callable[[EvalPoint], bool | None]
ProgressCallback = Callable[[int, int, float], None]


def train(
    spec: TrainSpec,
    on_eval: StopCallback | None = None,
    on_step: ProgressCallback | None = None,
    corpus: Corpus | None = None,
) -> TrainResult:
    """Train `spec` for exactly its budget's whole steps.

    `on_eval(point)` is called after every evaluation; returning True stops the run
    (status `stopped`). `on_step(step, steps, loss)` reports progress. Raises `TrainSpecError`
    (or the corpus's `CorpusError`) for an invalid spec before any training; a NaN or exploding
    loss is a result (`diverged`), not an exception."""
    run = training_run(spec, on_step, corpus)
    try:
        point = next(run)
        while True:
            stop = bool(on_eval(point)) if on_eval is not None else False
            point = run.send(stop)
    except StopIteration as finished:
        result: TrainResult = finished.value
        return result


def training_run(
    spec: TrainSpec,
    on_step: ProgressCallback | None = None,
    corpus: Corpus | None = None,
) -> Generator[EvalPoint, bool, TrainResult]:
    """The training loop as a generator: yields every `EvalPoint` and receives whether to stop
    (`run.send(True)`); returns the `TrainResult` (as StopIteration's value). `train` drives
    it with a callback; the Ray task streams its points.

    A segment (`TrainSpec.start_step`, `stop_step`) loads its checkpoint before any training
    (a bad one is a `CheckpointError`), trains the main line from start_step to stop_step
    exactly as the straight-through run trains those steps (schedule over the whole run,
    evaluations at its cadence, the same batches), and, stopping before the end, saves the
    main line's state and then trains and evaluates a decay branch (`decay_branch`): that
    loss is the segment's final one, and is not streamed."""
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    corpus = corpus or load_corpus(
        spec.corpus,
        val_fraction=spec.val_fraction,
        root=spec.corpus_root,
        text_field=spec.text_field,
        tokenizer=spec.tokenizer,
        tokenizer_vocab=spec.tokenizer_vocab,
    )
    cfg = spec.arch
    if corpus.vocab_size > cfg.vocab_size:
        raise TrainSpecError(
            "arch.vocab_size",
            f"the corpus has {corpus.vocab_size} token ids, the model only {cfg.vocab_size}",
        )
    corpus.check_fits(spec.batch_size, cfg.seq_len)
    steps = spec.planned_steps()
    if steps < 1:
        raise TrainSpecError(
            "budget",
            f"buys {spec.planned_tokens()} tokens, fewer than one step of "
            f"{spec.tokens_per_step} (batch_size × seq_len)",
        )
    stop_at = steps if spec.stop_step is None else spec.stop_step  # the main line's last step
    store = _segment_store(spec, stop_at < steps)
    device = resolve_device(spec.device)
    allocator.for_training()  # every step reuses the pages of the one before
    allocator.release()  # and this run's peak memory is its own
    model = initial_model(spec).to(device)
    params = int(param_count(cfg).total)
    opt = make_optimizer(model, spec)
    generator = batch_generator(spec)
    if spec.start_step > 0:
        assert store is not None and spec.checkpoint_in is not None  # TrainSpec checks it
        resume(spec, store, spec.checkpoint_in, model, opt, generator)
    step_model: Any = torch.compile(model) if spec.compile else model
    batches = train_batches(corpus, spec, generator)
    eval_batches = corpus.eval_batches(spec.batch_size, cfg.seq_len, spec.eval_batches)
    interval = spec.eval_interval or max(1, steps // spec.n_evals)
    bpb = bits_per_byte(corpus.tokens_per_byte(eval_batches))
    flops_per_token = float(training_flops_per_token(cfg, causal=True))
    explode_at = spec.divergence_factor * math.log(cfg.vocab_size)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    peak_rss = rss_bytes()
    # the first step's saved tensors and training state (a compiled graph saves its own)
    meter = None if spec.compile else SavedTensors(model)
    saved_bytes = held_bytes = 0

    curve: list[EvalPoint] = []
    status, reason = "completed", _trained(spec, steps, stop_at)
    train_loss = float("nan")
    done = spec.start_step
    eval_time = 0.0
    start = time.perf_counter()
    model.train()
    for step in range(spec.start_step, stop_at):
        set_learning_rates(opt, spec, step, steps)
        saved = meter if step == spec.start_step else None
        train_loss, failure = optimizer_step(
            step_model, model, opt, next(batches), spec, explode_at, f"step {step}", saved
        )
        if saved is not None:
            saved_bytes, held_bytes = saved.bytes, state_bytes(model, opt)
        if failure is not None:
            status, reason = "diverged", failure
            break
        done = step + 1
        if on_step is not None:
            on_step(done, steps, train_loss)
        if device.type == "cpu" and done % 10 == 0:
            peak_rss = max(peak_rss, rss_bytes())
        if done % interval == 0 or done == steps:
            eval_start = time.perf_counter()
            val = evaluate(step_model, eval_batches, device)
            eval_time += time.perf_counter() - eval_start
            point = EvalPoint(
                step=done,
                tokens=done * spec.tokens_per_step,
                flops=done * spec.tokens_per_step * flops_per_token,
                val_loss=val,
                train_loss=train_loss,
                elapsed_s=time.perf_counter() - start,
                val_bpb=bpb(val),
            )
            curve.append(point)
            if not math.isfinite(val) or val > explode_at:
                status, reason = "diverged", f"validation loss {val:.4g} at step {done}"
                break
            stop = yield point
            if stop and done < steps:
                status, reason = "stopped", f"stopped by the callback after step {done}"
                break

    final_val = curve[-1].val_loss if curve else float("nan")
    branch, checkpoint = 0, None
    if status == "completed" and done < steps:  # a segment's stop: save, then decay
        assert store is not None and spec.checkpoint_out is not None  # TrainSpec checks it
        state = Checkpoint(
            step=done,
            fingerprint=spec.fingerprint(),
            model=model.state_dict(),
            optimizer=opt.state_dict(),
            batch_generator=generator.get_state(),
        )
        save_checkpoint(store, spec.checkpoint_out, state, spec.max_checkpoint_bytes)
        checkpoint = spec.checkpoint_out
        branch, train_loss, failure = decay_branch(
            spec, step_model, model, opt, batches, done, steps, explode_at
        )
        if failure is None:
            eval_start = time.perf_counter()
            final_val = evaluate(step_model, eval_batches, device)
            eval_time += time.perf_counter() - eval_start
            if not math.isfinite(final_val) or final_val > explode_at:
                failure = f"validation loss {final_val:.4g} after the decay branch at step {done}"
        if failure is not None:
            status, reason = "diverged", failure
    wall = time.perf_counter() - start
    peak_rss = max(peak_rss, rss_bytes())
    if device.type == "cuda":
        peak, kind = int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    elif meter is not None:  # the terms of cost_model.training_memory, as measured
        peak, kind = held_bytes + saved_bytes, "cpu_saved_tensors"
    else:  # RSS includes the allocator's cache and the interpreter: an upper bound
        peak, kind = peak_rss, "cpu_peak_rss"
    tokens_seen = (done - spec.start_step + branch) * spec.tokens_per_step
    vals = [v for v in [*(p.val_loss for p in curve), final_val] if math.isfinite(v)]
    log.info("%s: %s (%d steps, %.1fs)", cfg.variant, reason, done, wall)
    return TrainResult(
        status=status,
        reason=reason,
        final_val_loss=final_val,
        best_val_loss=min(vals) if vals else float("nan"),
        final_train_loss=train_loss,
        curve=curve,
        steps=done,
        tokens_seen=tokens_seen,
        flops_spent=tokens_seen * flops_per_token,
        flops_budget=spec.budget_flops,
        wall_time_s=wall,
        eval_time_s=eval_time,
        tokens_per_s=tokens_seen / (wall - eval_time) if wall > eval_time else 0.0,
        peak_memory_bytes=peak,
        memory_kind=kind,
        device=str(device),
        params=params,
        corpus=corpus.info.as_dict(),
        start_step=spec.start_step,
        branch_steps=branch,
        checkpoint=checkpoint,
        device_name=device_name(device),
        saved_tensor_bytes=saved_bytes,
        state_bytes=held_bytes,
        peak_rss_bytes=peak_rss,
        final_val_bpb=bpb(final_val),
        best_val_bpb=bpb(min(vals)) if vals else math.nan,
    )


def bits_per_byte(tokens_per_byte: float | None) -> Callable[[float], float]:
    """The conversion of a loss in nats per token to bits per byte of text, given the
    evaluation's tokens per byte (None: no text, so NaN). For byte tokens (one byte each)
    it is loss / ln 2 exactly."""
    if tokens_per_byte is None:
        return lambda loss: math.nan
    if tokens_per_byte == 1.0:
        return lambda loss: loss / math.log(2)
    return lambda loss: loss * tokens_per_byte / math.log(2)


def optimizer_step(
    step_model: Any,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    spec: TrainSpec,
    explode_at: float,
    where: str,
    saved: SavedTensors | None = None,
) -> tuple[float, str | None]:
    """One training step on `batch` at the learning rates already set: forward, backward,
    gradient clipping, AdamW. Returns the training loss and, when the step diverged (a loss
    that is NaN or above `explode_at`, a non-finite gradient norm; no update then), why.
    With `saved`, the forward's saved tensors are counted there."""
    device = next(model.parameters()).device
    x, y = (t.to(device, non_blocking=True) for t in batch)
    with _autocast(device), saved.hooks() if saved is not None else contextlib.nullcontext():
        _, loss = step_model(x, y)
    train_loss = float(loss.item())
    if not math.isfinite(train_loss) or train_loss > explode_at:
        return train_loss, f"training loss {train_loss:.4g} at {where} (limit {explode_at:.3g})"
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip))
    if not math.isfinite(grad_norm):
        return train_loss, f"gradient norm {grad_norm} at {where}"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return train_loss, None


def decay_branch(
    spec: TrainSpec,
    step_model: Any,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    stop: int,
    total: int,
    explode_at: float,
) -> tuple[int, float, str | None]:
    """The decay branch after the main line's step `stop` (of `total`): `spec.branch_steps()`
    = D steps on the batches that follow in the run's stream, step j's learning rate going
    linearly from the main line's next one, lr_at(spec, stop, total), to the floor
    min_lr_ratio · lr: base + (floor − base)·(j + 1)/D (times each group's `lr_mult`).
    Returns the steps trained, the last training loss and, if it diverged, why."""
    n = spec.branch_steps()
    base, floor = lr_at(spec, stop, total), spec.min_lr_ratio * spec.lr
    train_loss = float("nan")
    for j in range(n):
        lr = base + (floor - base) * (j + 1) / n
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_mult"]
        where = f"step {j} of the decay branch after step {stop}"
        train_loss, failure = optimizer_step(
            step_model, model, opt, next(batches), spec, explode_at, where
        )
        if failure is not None:
            return j, train_loss, failure
    return n, train_loss, None


def resume(
    spec: TrainSpec,
    store: ArtifactStore,
    key: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    generator: torch.Generator,
) -> None:
    """Set `model`, `opt` and the batch `generator` to the main line's state at
    `spec.start_step` from the checkpoint `key`; `CheckpointError` when it is not that state
    (`load_checkpoint`) or does not fit this model and optimizer."""
    state = load_checkpoint(
        store, key, spec.fingerprint(), spec.start_step, spec.max_checkpoint_bytes
    )
    try:
        model.load_state_dict(state.model)
        opt.load_state_dict(state.optimizer)
        generator.set_state(state.batch_generator)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError("checkpoint", f"{key} does not fit this run: {exc}") from exc


def _segment_store(spec: TrainSpec, saves: bool) -> ArtifactStore | None:
    """The artifact store of a segment (None straight through), its keys checked and, when
    this run will save a checkpoint, the store checked writable: before any training."""
    if spec.start_step == 0 and not saves:
        return None
    assert spec.artifact_store is not None  # TrainSpec checks it
    store = ArtifactStore(spec.artifact_store)
    for key in (spec.checkpoint_in if spec.start_step > 0 else None, spec.checkpoint_out):
        if key is not None:
            check_key(key)
    if saves:
        store.check()
    return store


def _trained(spec: TrainSpec, steps: int, stop_at: int) -> str:
    """The reason of a completed run."""
    if spec.start_step == 0 and stop_at == steps:
        return f"trained {steps} steps"
    text = f"trained steps {spec.start_step + 1} to {stop_at} of {steps}"
    if stop_at < steps:
        text += f", then a decay branch of {spec.branch_steps()} steps"
    return text
