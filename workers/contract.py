"""The contract between the service and the workers, without torch: what a training run is
asked to do (`TrainSpec`), what it reports while it trains (`EvalPoint`) and what it returns
(`TrainResult`). The HTTP service and the runner import these types only, so they never load
torch; `workers.train` runs them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from cost_model import ArchConfig, CostInputError, tokens_for_budget

#: The learning-rate schedules (the service's `spec.Training.schedule` is typed by this too).
Schedule = Literal["cosine", "wsd"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)
STATUSES = ("completed", "stopped", "diverged")


class TrainSpecError(CostInputError):
    """An invalid training specification (`field`, `reason`)."""

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (it crosses Ray)
        return (type(self), (self.field, self.reason))


#: Where a `TrainSpec` field is set, in its metadata (`TRAIN_FIELDS`): `job` (the job spec's
#: `training` section has a field of that name; its value there, when not True, is the
#: section's own default) and `cli` (`depthscope train` has a flag of that name).
def _user(help: str, *, job: object = True, cli: bool = True) -> dict[str, Any]:
    """A field the user sets: in the job spec's `training` section and as a flag."""
    return {"help": help, "job": job, "cli": cli}


def _cli(help: str) -> dict[str, Any]:
    """A field of one run only: a flag of `depthscope train` (a job sets it itself)."""
    return _user(help, job=False)


def _fixed(help: str) -> dict[str, Any]:
    """A field at its default everywhere (the trainer's constant)."""
    return _user(help, job=False, cli=False)


def _run(help: str) -> dict[str, Any]:
    """A field set per run by whoever builds the spec (the runner, the CLI's own flags)."""
    return _user(help, job=False, cli=False)


@dataclass(frozen=True)
class TrainSpec:
    """Everything one training run needs. Sequences are `arch.seq_len` tokens long.

    Exactly one of `budget_flops` (training FLOPs, causal count of `cost_model.flops`) and
    `budget_tokens` is given. Learning rate: linear warmup over `warmup_frac` of the steps,
    then cosine decay to `min_lr_ratio`·lr, or WSD (warmup, stable, then a linear decay over the
    last `decay_frac`). Validation every `eval_interval` steps (None: `n_evals` evenly spaced
    evaluations) on `eval_batches` fixed batches.

    Optimizer: AdamW in three parameter groups (`workers.train.parameter_groups`): `decay`
    (matrices and embeddings, weight decay `weight_decay`), `no_decay` (gains, biases and other
    vectors, weight decay 0) and `depth_mixing` (the residual wiring's own parameters, each
    mixer's `depth_mixing_parameters`: AttnRes pseudo-queries, key-norm gains and
    input-dependent query projections, mHC-lite's coefficient projections, gates and biases,
    DenseFormer's weights; never weight-decayed), whose learning rate at every step is
    `depth_lr_mult` times the schedule's (0 freezes them at their initial values).

    Each field's metadata gives its help and where it is set (`_user`, `_cli`, `_fixed`,
    `_run`), read as `TRAIN_FIELDS`.
    """

    arch: ArchConfig = field(metadata=_run("the architecture (the CLI's flags: `--n-layers`, …)"))
    budget_flops: float | None = field(
        default=None, metadata=_run("training FLOPs (the spec's budget; the CLI's --flops)")
    )
    budget_tokens: int | None = field(
        default=None, metadata=_run("training tokens (the spec's budget; the CLI's --tokens)")
    )
    batch_size: int = field(default=16, metadata=_user("sequences per optimizer step"))
    lr: float = field(default=3e-3, metadata=_user("peak learning rate"))
    depth_lr_mult: float = field(
        default=1.0,
        metadata=_user("learning-rate multiplier of the depth-mixing parameters only"),
    )
    schedule: Schedule = field(default="cosine", metadata=_user("learning-rate schedule"))
    warmup_frac: float = field(default=0.05, metadata=_user("share of the steps warming up"))
    decay_frac: float = field(
        default=0.2, metadata=_user("WSD only: share of the steps decaying at the end")
    )
    min_lr_ratio: float = field(default=0.1, metadata=_fixed("cosine's floor, of lr"))
    weight_decay: float = field(default=0.1, metadata=_user("AdamW's weight decay"))
    beta1: float = field(default=0.9, metadata=_fixed("AdamW's beta1"))
    beta2: float = field(default=0.95, metadata=_fixed("AdamW's beta2"))
    grad_clip: float = field(default=1.0, metadata=_fixed("gradient norm clip"))
    seed: int = field(default=0, metadata=_cli("the run's seed (a job: its seeds)"))
    eval_interval: int | None = field(
        default=None, metadata=_cli("steps between evaluations (default: n_evals evenly)")
    )
    n_evals: int = field(
        default=10, metadata=_user("evaluations, evenly spaced (a job's default: 8)", job=8)
    )
    eval_batches: int = field(default=8, metadata=_user("validation batches per evaluation"))
    corpus: str | None = field(
        default=None, metadata=_user("text file, folder or token file (default: built-in)")
    )
    corpus_root: str | None = field(
        default=None,
        metadata=_run(
            "the folder `corpus` (then a relative path) is read beneath, no link followed: "
            "the service's data folder (`workers.data.load_corpus`'s `root`); None: a "
            "caller's own path"
        ),
    )
    val_fraction: float = field(default=0.1, metadata=_fixed("share of the corpus held out"))
    text_field: str = field(
        default="text", metadata=_user("the field of a JSON Lines or Parquet record holding text")
    )
    tokenizer: str = field(
        default="byte",
        metadata=_user(
            "byte (one token per UTF-8 byte) or bpe: a byte-level BPE of tokenizer_vocab ids "
            "trained on the corpus's train split (`workers.tokenizer`; arch.vocab_size equals "
            "it); the job spec's tokenizer section {kind, vocab_size} gives both",
            cli=False,
        ),
    )
    tokenizer_vocab: int | None = field(
        default=None, metadata=_run("a BPE's ids (the job spec's tokenizer.vocab_size)")
    )
    device: str = field(default="auto", metadata=_cli("auto | cpu | cuda"))
    compile: bool = field(default=False, metadata=_cli("torch.compile the model"))
    threads: int | None = field(
        default=None, metadata=_user("torch intra-op threads (default: leave as is)")
    )
    divergence_factor: float = field(
        default=3.0, metadata=_fixed("a loss above factor · ln(vocab) counts as exploding")
    )
    start_step: int = field(
        default=0, metadata=_run("> 0: resume the main line from checkpoint_in at this step")
    )
    stop_step: int | None = field(default=None, metadata=_run("None: train to planned_steps()"))
    checkpoint_in: str | None = field(
        default=None, metadata=_run("a key in the artifact store (made by the runner)")
    )
    checkpoint_out: str | None = field(
        default=None, metadata=_run("a key in the artifact store (made by the runner)")
    )
    artifact_store: str | None = field(
        default=None, metadata=_run("the store's root: a folder or an fsspec URL")
    )
    max_checkpoint_bytes: int = field(
        default=2**30, metadata=_run("a larger checkpoint is refused, saved or loaded")
    )

    def __post_init__(self) -> None:
        if not isinstance(self.arch, ArchConfig):
            raise TrainSpecError("arch", "must be an ArchConfig")
        if (self.budget_flops is None) == (self.budget_tokens is None):
            raise TrainSpecError("budget", "give exactly one of budget_flops and budget_tokens")
        if self.budget_flops is not None and not self.budget_flops > 0:
            raise TrainSpecError("budget_flops", f"must be positive, got {self.budget_flops}")
        if self.budget_tokens is not None and self.budget_tokens < 1:
            raise TrainSpecError("budget_tokens", f"must be positive, got {self.budget_tokens}")
        positive_ints = ("batch_size", "n_evals", "eval_batches")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise TrainSpecError(name, f"must be positive, got {getattr(self, name)}")
        if self.eval_interval is not None and self.eval_interval < 1:
            raise TrainSpecError("eval_interval", f"must be positive, got {self.eval_interval}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainSpecError("lr", f"must be a positive number, got {self.lr}")
        if not (self.depth_lr_mult >= 0 and math.isfinite(self.depth_lr_mult)):
            raise TrainSpecError(
                "depth_lr_mult", f"must be a finite non-negative number, got {self.depth_lr_mult}"
            )
        if self.schedule not in SCHEDULES:
            raise TrainSpecError(
                "schedule", f"unknown value {self.schedule!r}; expected {' or '.join(SCHEDULES)}"
            )
        for name in ("warmup_frac", "decay_frac", "min_lr_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise TrainSpecError(name, f"must lie in [0, 1], got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise TrainSpecError("weight_decay", f"must be non-negative, got {self.weight_decay}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TrainSpecError(
                "device", f"unknown value {self.device!r}; expected auto, cpu or cuda"
            )
        if self.threads is not None and self.threads < 1:
            raise TrainSpecError("threads", f"must be positive, got {self.threads}")
        if self.corpus_root is not None and (self.corpus is None or self.corpus.startswith("/")):
            raise TrainSpecError(
                "corpus", "must be a path relative to corpus_root when corpus_root is given"
            )
        if self.tokenizer not in ("byte", "bpe"):
            raise TrainSpecError(
                "tokenizer", f"unknown kind {self.tokenizer!r}; expected byte or bpe"
            )
        if self.tokenizer == "bpe" and self.tokenizer_vocab != self.arch.vocab_size:
            raise TrainSpecError(
                "tokenizer_vocab",
                f"a BPE of {self.tokenizer_vocab} ids needs arch.vocab_size equal to it, "
                f"not {self.arch.vocab_size}",
            )
        if self.max_checkpoint_bytes < 1:
            raise TrainSpecError(
                "max_checkpoint_bytes", f"must be positive, got {self.max_checkpoint_bytes}"
            )
        self._check_segment()

    def _check_segment(self) -> None:
        """The segment fields (see the class): 0 ≤ start_step < stop_step ≤ T, a stop before
        T in the stable phase with a checkpoint to save, a start after 0 with one to load,
        WSD only."""
        if self.start_step < 0:
            raise TrainSpecError("start_step", f"must be non-negative, got {self.start_step}")
        if self.start_step == 0 and self.stop_step is None:
            return  # straight through
        if self.schedule != "wsd":
            raise TrainSpecError(
                "schedule",
                "training in segments (start_step, stop_step) is exact only under the WSD "
                f"schedule (its stable phase), not {self.schedule}",
            )
        total = self.planned_steps()
        if total < 1:
            return  # the trainer refuses the budget itself
        stop = total if self.stop_step is None else self.stop_step
        if not self.start_step < stop <= total:
            name = "start_step" if self.stop_step is None else "stop_step"
            raise TrainSpecError(
                name,
                f"need start_step < stop_step ≤ {total} (the run's steps), got "
                f"start_step {self.start_step}, stop_step {self.stop_step}",
            )
        if self.start_step > 0 and self.checkpoint_in is None:
            raise TrainSpecError(
                "checkpoint_in", f"start_step {self.start_step} resumes from a checkpoint: give one"
            )
        if stop < total:
            stable_end = total - int(self.decay_frac * total)
            if stop > stable_end:
                raise TrainSpecError(
                    "stop_step",
                    f"{stop} is past the stable phase (steps up to {stable_end} of {total} with "
                    f"decay_frac {self.decay_frac}): the main line's state there is not the "
                    "start of a decay",
                )
            if self.checkpoint_out is None:
                raise TrainSpecError(
                    "checkpoint_out", f"stop_step {stop} < {total} saves a checkpoint: give a key"
                )
        if self.artifact_store is None and (self.start_step > 0 or stop < total):
            raise TrainSpecError("artifact_store", "a segment's checkpoints need a store")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.arch.seq_len

    def planned_tokens(self) -> int:
        """The tokens the budget buys (before rounding down to whole steps)."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        assert self.budget_flops is not None
        return tokens_for_budget(self.arch, self.budget_flops)

    def planned_steps(self) -> int:
        return self.planned_tokens() // self.tokens_per_step

    def replace(self, **changes: Any) -> TrainSpec:
        return dataclasses.replace(self, **changes)

    def branch_steps(self) -> int:
        """The decay branch's steps after a stop before the end: max(1, int(decay_frac ·
        stop_step)); 0 when the run trains to its end (`planned_steps()`)."""
        if self.stop_step is None or self.stop_step >= self.planned_steps():
            return 0
        return max(1, int(self.decay_frac * self.stop_step))

    def fingerprint(self) -> str:
        """A stable hex hash (sha256) of every field that shapes the training trajectory
        (`TRAJECTORY_FIELDS`): two specs with the same one train the same main line, so a
        checkpoint of one can continue the other. Evaluation, device and segment fields are
        left out."""
        fields = {
            name: dataclasses.asdict(value) if name == "arch" else value
            for name in TRAJECTORY_FIELDS
            for value in (getattr(self, name),)
        }
        # the text field and tokenizer join only where not their defaults, so a byte-level
        # run's fingerprint (and the checkpoints it keys) is what it was before they existed
        fields |= {
            name: value
            for name, default in TOKEN_FIELDS.items()
            if (value := getattr(self, name)) != default
        }
        text = json.dumps(fields, sort_keys=True, allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class TrainField:
    """One field of `TrainSpec` as its declaration gives it: its type (`kind`: int, float,
    str or bool; a Literal's values in `choices`), whether None is a value, its default and a
    line of help; whether the job spec's `training` section has it (`job`, with the
    section's default `job_default`) and whether `depthscope train` has a flag for it (`cli`)."""

    name: str
    kind: type
    optional: bool
    choices: tuple[str, ...]
    default: Any  # dataclasses.MISSING for `arch`
    help: str
    job: bool
    job_default: Any
    cli: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _train_field(f: dataclasses.Field[Any], hint: Any) -> TrainField:
    optional = get_origin(hint) is not Literal and type(None) in get_args(hint)
    if optional:  # `X | None`
        hint = next(a for a in get_args(hint) if a is not type(None))
    choices = tuple(str(v) for v in get_args(hint)) if get_origin(hint) is Literal else ()
    kind = str if choices else hint
    job = f.metadata["job"]
    job_default = f.default if isinstance(job, bool) else job
    return TrainField(
        f.name,
        kind,
        optional,
        choices,
        f.default,
        f.metadata["help"],
        job is not False,
        job_default,
        f.metadata["cli"],
    )


#: Every field of `TrainSpec`, in its order: the one declaration the job spec's training
#: section (`nas_service.spec.Training`) and the flags of `depthscope train` are made from.
_HINTS = get_type_hints(TrainSpec)
TRAIN_FIELDS: dict[str, TrainField] = {
    f.name: _train_field(f, _HINTS[f.name]) for f in dataclasses.fields(TrainSpec)
}

#: The `TrainSpec` fields a training trajectory depends on (`TrainSpec.fingerprint`).
TRAJECTORY_FIELDS = (
    "arch",
    "budget_flops",
    "budget_tokens",
    "batch_size",
    "lr",
    "depth_lr_mult",
    "schedule",
    "warmup_frac",
    "decay_frac",
    "min_lr_ratio",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "seed",
    "corpus",
    "val_fraction",
)


#: The fields of how text becomes tokens, with their defaults (`TrainSpec.fingerprint`).
TOKEN_FIELDS: dict[str, object] = {
    "text_field": "text",
    "tokenizer": "byte",
    "tokenizer_vocab": None,
}


def branch_steps(spec: TrainSpec) -> int:
    """`spec.branch_steps()`: the decay branch's steps of a segment (0 for none)."""
    return spec.branch_steps()


@dataclass(frozen=True)
class EvalPoint:
    """One validation measurement during training."""

    step: int
    tokens: int
    flops: float
    val_loss: float
    train_loss: float
    elapsed_s: float
    #: val_loss in bits per UTF-8 byte of the validation text (NaN for a token file)
    val_bpb: float = math.nan


#: How a run's `peak_memory_bytes` is measured: on CUDA the allocator's peak
#: (`torch.cuda.max_memory_allocated`); on the CPU `state_bytes + saved_tensor_bytes` (the
#: terms of `cost_model.training_memory`: weights, gradients, optimizer state, activations),
#: or, where the saved tensors are not measured (a compiled model), the peak RSS.
MEMORY_KINDS = ("cuda_max_allocated", "cpu_saved_tensors", "cpu_peak_rss")


@dataclass
class TrainResult:
    """The outcome of one run. `status` is completed, stopped (by the callback) or diverged.

    For a segment (`TrainSpec.start_step`, `stop_step`): `steps` is the main-line step
    reached, `curve` the main line's evaluations in (start_step, steps], `final_val_loss` the
    decay branch's (when there was one), `tokens_seen` and `flops_spent` what this run
    trained: (steps − start_step + branch_steps) steps; `checkpoint` the key it saved."""

    status: str
    reason: str
    final_val_loss: float  # NaN when the run diverged before any evaluation
    best_val_loss: float
    final_train_loss: float
    curve: list[EvalPoint]
    steps: int
    tokens_seen: int
    flops_spent: float
    flops_budget: float | None
    wall_time_s: float
    eval_time_s: float  # part of wall_time_s spent evaluating
    tokens_per_s: float  # training throughput: tokens / (wall time − evaluation time)
    peak_memory_bytes: int
    memory_kind: str  # MEMORY_KINDS: how peak_memory_bytes was measured
    device: str
    params: int
    corpus: dict[str, Any] = field(default_factory=dict)
    start_step: int = 0
    branch_steps: int = 0  # decay-branch steps trained after the main line
    checkpoint: str | None = None  # the key of the main line's state saved by this run
    device_name: str = ""  # "cpu", or the CUDA device's name (torch.cuda.get_device_name)
    #: bytes of the distinct storages autograd saved for backward in the run's first step,
    #: parameters excluded (the measured activation memory; 0 when not measured)
    saved_tensor_bytes: int = 0
    #: bytes of the parameters, their gradients and the optimizer's state (AdamW's moments)
    state_bytes: int = 0
    peak_rss_bytes: int = 0  # the process's peak resident set (the allocator's cache included)
    #: final_val_loss and best_val_loss in bits per UTF-8 byte of the validation text:
    #: loss · (target tokens / their bytes) / ln 2 (NaN for a token file, which has no text)
    final_val_bpb: float = math.nan
    best_val_bpb: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
