"""How every candidate is trained (`Training`, whose fields are `TrainSpec`'s), the
training axes that may be searched (`TRAINING_AXES`, their bounds, `FloatRange`,
`TrainAxis`), the tokenizer, the per-shape grid (`Tune`) and its held-out confirmation
(`Confirm`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nas_service.spec.fields import (
    MAX_DEPTH_LR_MULT,
    MAX_EVALS,
    MAX_LR,
    MAX_VOCAB,
    Text,
    _check_choices,
    _number,
    _refuse,
    _Strict,
)
from workers.contract import TRAIN_FIELDS, Schedule
from workers.tokenizer import MAX_BPE_VOCAB, MIN_BPE_VOCAB

#: The training fields that may be searched (the contract's training axes), in this order.
TRAINING_AXES: tuple[str, ...] = ("lr", "depth_lr_mult", "warmup_frac", "weight_decay")


@dataclass(frozen=True)
class _Bounds:
    """The values a training axis takes: low < v (open) or low <= v, and v <= high."""

    low: float
    high: float
    open_low: bool = False

    def admits(self, value: float) -> bool:
        return (value > self.low if self.open_low else value >= self.low) and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"


#: Each training axis's bounds: lr in (0, MAX_LR], depth_lr_mult in [0, MAX_DEPTH_LR_MULT],
#: warmup_frac in [0, 1], weight_decay in [0, MAX_LR].
TRAINING_BOUNDS: dict[str, _Bounds] = {
    "lr": _Bounds(0.0, MAX_LR, open_low=True),
    "depth_lr_mult": _Bounds(0.0, MAX_DEPTH_LR_MULT),
    "warmup_frac": _Bounds(0.0, 1.0),
    "weight_decay": _Bounds(0.0, MAX_LR),
}


class FloatRange(_Strict):
    """A continuous range of a training axis, sampled uniformly in [low, high], or uniformly
    in ln v when `log` (both bounds then positive). A searched range is a study parameter
    (`suggest_float`); the grid sampler needs choices instead."""

    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.high < self.low:
            raise ValueError(f"inverted range: high {self.high:g} < low {self.low:g}")
        if self.high == self.low:
            raise ValueError(f"empty range: low = high = {self.low:g}; give a single value instead")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs positive bounds, got low {self.low:g}")
        return self


def _training_kind(value: Any) -> str:
    if isinstance(value, dict | FloatRange):
        return "range"
    return "choices" if isinstance(value, list | tuple) else "single"


#: A training axis: one value (fixed), choices `[1e-3, 3e-3]` or a range `{low, high, log}`.
TrainAxis = Annotated[
    Annotated[float, Tag("single")]
    | Annotated[list[float], Tag("choices")]
    | Annotated[FloatRange, Tag("range")],
    Discriminator(_training_kind),
]


def _numbers(value: Any) -> Any:
    """`_number` of a single value or of each choice (a range is left to `FloatRange`)."""
    if isinstance(value, dict | FloatRange):
        return value
    if isinstance(value, list | tuple):
        for v in value:
            _number(v)
        return value
    if not isinstance(value, int | float | str):
        raise ValueError("must be a number, a list of choices or a range {low, high, log}")
    return _number(value)


def _check_training_axis(name: str, value: float | list[float] | FloatRange) -> None:
    """`value` (one number, choices or a range) within the axis's bounds; choices distinct."""
    bounds = TRAINING_BOUNDS[name]
    if isinstance(value, FloatRange):
        for end in ("low", "high"):
            v = getattr(value, end)
            if not bounds.admits(v):
                raise ValueError(f"{end} {v:g} is outside {bounds}, the values {name} takes")
        return
    if isinstance(value, list):
        _check_choices(value, positive=False)
        for i, v in enumerate(value):
            if not bounds.admits(v):
                raise ValueError(f"value {i} ({v:g}) is outside {bounds}, the values {name} takes")
        return
    if not bounds.admits(value):
        raise ValueError(f"{value:g} is outside {bounds}, the values {name} takes")


class ByteTokens(_Strict):
    """One token per UTF-8 byte (256 ids): the default."""

    kind: Literal["byte"] = "byte"


class BpeTokens(_Strict):
    """A byte-level BPE of `vocab_size` ids trained by the workers on the corpus's training
    documents (`workers.tokenizer`); the architecture's vocabulary is then `vocab_size`, so
    the cost model prices its embedding and head."""

    kind: Literal["bpe"]
    vocab_size: int = Field(ge=MIN_BPE_VOCAB, le=MAX_BPE_VOCAB)


Tokenizer = Annotated[ByteTokens | BpeTokens, Field(discriminator="kind")]


def _train(name: str, **bounds: Any) -> Any:
    """The field `name` of `TrainSpec` as the section declares it: the default and help of
    its declaration (`workers.contract.TRAIN_FIELDS`: a job's default where it differs),
    and the spec's bounds."""
    declared = TRAIN_FIELDS[name]
    return Field(default=declared.job_default, description=declared.help, **bounds)


class Training(_Strict):
    """How every candidate is trained: `TrainSpec`'s fields of the same names, except
    `ARCH_FIELDS`, which go to the architecture (`base_arch`). seq_len, batch_size and threads
    are bounded by the operator's limits (`check_job`); the corpus is a name registered by the
    operator or a path inside the data folder (`resolve_corpus`). The fields that are
    `TrainSpec`'s take their default and help from its declaration (`_train`:
    `workers.contract.TRAIN_FIELDS`, which says which of its fields a job sets).

    The training axes (`TRAINING_AXES`: lr, depth_lr_mult, warmup_frac, weight_decay) each
    take one value (fixed), choices or a range (`FloatRange`): searched, they are joint axes,
    study parameters under their own names (`CandidateSpace.study_axes`). A trial's values of
    them are its setting (`nas_service.search.study.training_setting`); `depth_lr_mult` multiplies
    the learning rate of the depth-mixing parameters only."""

    ARCH_FIELDS: ClassVar[frozenset[str]] = frozenset({"vocab_size", "seq_len"})

    corpus: Text | None = _train("corpus", min_length=1, max_length=4096)  # None: built-in
    text_field: Text = _train("text_field", min_length=1, max_length=200)
    tokenizer: Tokenizer = Field(default_factory=ByteTokens)
    vocab_size: int = Field(default=256, ge=2, le=MAX_VOCAB)  # with a BPE: its vocab_size
    seq_len: int = Field(default=128, ge=2)
    batch_size: int = _train("batch_size", ge=1)
    lr: TrainAxis = _train("lr")
    depth_lr_mult: TrainAxis = _train("depth_lr_mult")
    schedule: Schedule = _train("schedule")
    warmup_frac: TrainAxis = _train("warmup_frac")
    decay_frac: float = _train("decay_frac", ge=0, lt=1)
    weight_decay: TrainAxis = _train("weight_decay")
    n_evals: int = _train("n_evals", ge=1, le=MAX_EVALS)
    eval_batches: int = _train("eval_batches", ge=1, le=MAX_EVALS)
    threads: int | None = _train("threads", ge=1)

    @field_validator(*TRAINING_AXES, mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        return _numbers(value)

    @model_validator(mode="before")
    @classmethod
    def _bpe_vocab(cls, data: Any) -> Any:
        """A BPE's vocabulary is the model's: vocab_size follows it unless given too."""
        if isinstance(data, dict):
            tok = data.get("tokenizer")
            if isinstance(tok, dict) and tok.get("kind") == "bpe" and "vocab_size" not in data:
                vocab = tok.get("vocab_size")
                if isinstance(vocab, int) and not isinstance(vocab, bool):
                    data = {**data, "vocab_size": vocab}
        return data

    @model_validator(mode="after")
    def _bpe_vocab_agrees(self) -> Training:
        if isinstance(self.tokenizer, BpeTokens) and self.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} differs from tokenizer.vocab_size "
                f"{self.tokenizer.vocab_size}: a BPE's vocabulary is the model's (leave "
                "vocab_size out)"
            )
        return self

    @field_validator("decay_frac", mode="before")
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        return _number(value)

    @field_validator(*TRAINING_AXES)
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        _check_training_axis(info.field_name, value)
        return value

    def searched(self) -> dict[str, list[float] | FloatRange]:
        """The joint training axes (those given as choices or a range), in `TRAINING_AXES`
        order."""
        out: dict[str, list[float] | FloatRange] = {}
        for name in TRAINING_AXES:
            value = getattr(self, name)
            if isinstance(value, list | FloatRange):
                out[name] = value
        return out

    def fixed(self) -> dict[str, float]:
        """The training axes given one value, in `TRAINING_AXES` order."""
        searched = self.searched()
        return {n: float(getattr(self, n)) for n in TRAINING_AXES if n not in searched}


class Tune(_Strict):
    """The per-shape nested grid: every architecture the sampler proposes is trained at each
    combination of the listed values (`itertools.product` in `TRAINING_AXES` order; the other
    axes at their fixed or joint value). Tune axes are never study parameters."""

    lr: list[float] | None = None
    depth_lr_mult: list[float] | None = None
    warmup_frac: list[float] | None = None
    weight_decay: list[float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        """An unknown key is refused on its own field (`tune.<key>`), naming the axes."""
        if isinstance(data, dict):
            unknown = [k for k in data if k not in TRAINING_AXES]
            if unknown:
                expected = ", ".join(TRAINING_AXES)
                _refuse(
                    [
                        ((str(k),), f"unknown training axis {k!r}; expected one of {expected}")
                        for k in unknown
                    ]
                )
        return data

    @field_validator(*TRAINING_AXES, mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list of values (tune is a grid)")
        return _numbers(value)

    @field_validator(*TRAINING_AXES)
    @classmethod
    def _bounded(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        assert info.field_name is not None
        if value is not None:
            _check_training_axis(info.field_name, value)
        return value

    def axes(self) -> dict[str, list[float]]:
        """The listed axes, in `TRAINING_AXES` order."""
        lists = ((n, getattr(self, n)) for n in TRAINING_AXES)
        return {n: list(v) for n, v in lists if v is not None}

    def size(self) -> int:
        """The number of settings: the product of the lists' lengths (counted, not built)."""
        return math.prod(len(v) for v in self.axes().values())


class Confirm(_Strict):
    """Held-out confirmation of each trial's chosen setting: a trial trains its `tune` grid on
    the tuning seeds 0 … seeds−1, keeps the setting of lowest mean loss there, then trains
    that one setting on `seeds` fresh seeds (numbered on from the tuning seeds, the same for
    every trial, so they pair across variants). The trial's value, its profile, the optimum
    and `compare` score it on these: a loss that chose the setting is never the one that
    scores it, so a variant with more settings gets no more chances to look lucky."""

    seeds: int = Field(ge=2, description="fresh seeds the chosen setting is trained on (≥ 2)")
