"""The one description of a job's search space: its axes (`CandidateSpace.axes`), counted,
enumerated, and folded into the study's flat parameters.

An axis is a searched field of `SearchSpace` (`AXES` says which, under which parameter name,
and for which variants). A conditional axis (one that only some variants have, like Block
AttnRes's block size) is folded into the study's `residual` parameter, so that every Optuna
sampler (grid included) sees one flat space without conditional parameters:
`residual` is a variant, or a variant followed by `/<tag>=<value>` for each of its
conditional axes (`block_attnres/S=4`). `encode_residual` and `decode_residual` are that
codec and its inverse; nothing else reads or writes the string in Python (`residual_codec`
describes it to the dashboard, through `GET /v1/catalogue`).

The study's parameters are `residual`, the unconditional axes under their own names
(`n_layers`, `d_model` or `aspect_ratio`, `n_heads`), `budget` when the job has several, and
then the joint training axes (`training.lr`, ... given as choices or a range) under their own
names (`lr`, `depth_lr_mult`, `warmup_frac`, `weight_decay`): a range is `suggest_float`'s
(log-uniform when `log`), choices are categorical. They are not the architecture's:
`from_study` drops them, and `tune` axes are never study parameters.

Adding an axis: a field of `SearchSpace` (model.py) and a row of `AXES` (with the operator's
ceiling on its values, which `check_job` applies with the per-axis count limit); if it is an
`ArchConfig` field (`arch_field`), `build_candidate` passes it through.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from cost_model.residuals import BLOCK_SIZED
from nas_service.spec.fields import IntAxis, IntRange
from nas_service.spec.model import JobSpec
from nas_service.spec.training import TRAINING_AXES, FloatRange

if TYPE_CHECKING:
    from nas_service.settings import Settings

Kind = Literal["int", "float", "str"]


@dataclass(frozen=True)
class AxisDef:
    """How one field of `SearchSpace` becomes an axis."""

    name: str  # the parameter, as candidates and the study record it
    field: str  # the `SearchSpace` field holding its values (named in messages)
    kind: Kind
    variants: frozenset[str] | None = None  # only these variants have it (None: every one)
    tag: str | None = None  # its key in the study's `residual` (conditional axes only)
    arch_field: bool = True  # passed to `ArchConfig` as it is (else `build_candidate` derives)
    ceiling: Callable[[Settings], float] | None = None  # the operator's limit on its values


#: Every searched axis, in the order candidates and the study list them. `variant` comes first:
#: the conditional axes depend on it.
AXES: tuple[AxisDef, ...] = (
    AxisDef("variant", "variants", "str"),
    AxisDef("n_layers", "n_layers", "int", ceiling=lambda s: s.max_n_layers),
    AxisDef("d_model", "d_model", "int", arch_field=False, ceiling=lambda s: s.max_d_model),
    AxisDef("aspect_ratio", "aspect_ratio", "float", arch_field=False),  # width: check_job
    AxisDef("n_heads", "n_heads", "int", arch_field=False, ceiling=lambda s: s.max_d_model),
    AxisDef(
        "block_size",
        "block_sizes",
        "int",
        frozenset(BLOCK_SIZED),  # the variants with a block size (block_attnres)
        tag="S",
        ceiling=lambda s: 2 * s.max_n_layers,  # S counts sublayers
    ),
)
VARIANT = "variant"
RESIDUAL = "residual"  # the study's parameter: the variant and its conditional axes
BUDGET = "budget"  # the study's parameter when the job searches several budgets

_BY_TAG = {d.tag: d for d in AXES if d.tag is not None}


@dataclass(frozen=True)
class Axis:
    """One searched axis of a job: explicit `choices`, or an integer `range` (counted without
    being expanded: `values()` expands it, so call that on a spec `check_job` bounded), or a
    continuous `interval` (a training axis's `FloatRange`: sampled, never counted)."""

    name: str
    field: str
    choices: tuple[Any, ...] = ()
    range: IntRange | None = None
    variants: frozenset[str] | None = None
    ceiling: Callable[[Settings], float] | None = None
    interval: FloatRange | None = None

    @property
    def count(self) -> int:
        return self.range.count if self.range is not None else len(self.choices)

    @property
    def largest(self) -> Any:
        """The largest value, without expanding a range."""
        return self.range.last if self.range is not None else max(self.choices)

    def values(self) -> list[Any]:
        if self.interval is not None:
            raise ValueError(f"{self.field}: a continuous range has no list of values")
        return self.range.values() if self.range is not None else list(self.choices)

    def applies_to(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants

    @property
    def conditional(self) -> bool:
        return self.variants is not None


class Suggester(Protocol):
    """What `CandidateSpace.suggest` needs of a trial (an `optuna.Trial`)."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


def _axis(d: AxisDef, value: IntAxis | list[Any]) -> Axis:
    if isinstance(value, IntRange):
        return Axis(d.name, d.field, range=value, variants=d.variants, ceiling=d.ceiling)
    return Axis(d.name, d.field, tuple(value), variants=d.variants, ceiling=d.ceiling)


class CandidateSpace:
    """The axes of one job spec and everything read from them: the number of candidates,
    the candidates' parameters, the study's flat parameters and their grid, a trial's
    suggestion, and the mapping between a candidate's parameters and the study's."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        found = ((d, getattr(spec.space, d.field)) for d in AXES)
        self._axes = tuple(_axis(d, value) for d, value in found if value is not None)

    # -- the candidates ---------------------------------------------------------------------
    def axes(self) -> tuple[Axis, ...]:
        """The searched axes of the candidates, `variant` first."""
        return self._axes

    def variants(self) -> list[str]:
        return [str(v) for v in self._axes[0].values()]

    def _others(self, variant: str) -> list[Axis]:
        return [a for a in self._axes[1:] if a.applies_to(variant)]

    def size(self) -> int:
        """The number of candidates, counted arithmetically (nothing is expanded)."""
        return sum(math.prod(a.count for a in self._others(v)) for v in self.variants())

    def candidates(self) -> Iterator[dict[str, Any]]:
        """Every candidate's parameters (a conditional axis only for its variants), in axis
        order; expands the ranges, so call it on a spec `check_job` bounded."""
        for variant in self.variants():
            others = self._others(variant)
            for combo in itertools.product(*(a.values() for a in others)):
                yield {VARIANT: variant} | {a.name: v for a, v in zip(others, combo, strict=True)}

    # -- the study --------------------------------------------------------------------------
    def budgets(self) -> list[float]:
        """The budgets a trial chooses from (a study parameter only when there are several)."""
        return self.spec.budget.values()

    def study_axes(self) -> tuple[Axis, ...]:
        """The study's flat parameters: `residual` (each variant with its conditional axes
        folded in), the unconditional axes, `budget` when there are several, then the joint
        training axes (`training_axes`)."""
        residuals: list[str] = []
        for variant in self.variants():
            conditional = [a for a in self._others(variant) if a.conditional]
            for combo in itertools.product(*(a.values() for a in conditional)):
                values = dict(zip((a.name for a in conditional), combo, strict=True))
                residuals.append(encode_residual(variant, values))
        out = [Axis(RESIDUAL, "variants", tuple(residuals))]
        out += [a for a in self._axes[1:] if not a.conditional]
        if len(self.budgets()) > 1:
            out.append(Axis(BUDGET, "budget", tuple(self.budgets())))
        return (*out, *self.training_axes())

    def training_axes(self) -> tuple[Axis, ...]:
        """The joint training axes (`training.<axis>` given as choices or a range), in
        `TRAINING_AXES` order: study parameters after the architecture's and the budget."""
        out = []
        for name, value in self.spec.training.searched().items():
            field = f"training.{name}"
            if isinstance(value, FloatRange):
                out.append(Axis(name, field, interval=value))
            else:
                out.append(Axis(name, field, tuple(float(v) for v in value)))
        return tuple(out)

    def grid(self) -> dict[str, list[Any]]:
        """The study's parameters and all their values (the grid sampler's space). Raises
        ValueError for a joint training range (the spec refuses one with the grid sampler)."""
        return {a.name: a.values() for a in self.study_axes()}

    def suggest(self, trial: Suggester) -> dict[str, Any]:
        """A trial's study parameters (the fixed ones of an enqueued trial come back as they
        were; a `residual` outside the choices is refused by the trial)."""
        params: dict[str, Any] = {}
        for axis in self.study_axes():
            if axis.interval is not None:
                i = axis.interval
                params[axis.name] = trial.suggest_float(axis.name, i.low, i.high, log=i.log)
            elif axis.range is not None:
                r = axis.range
                params[axis.name] = trial.suggest_int(axis.name, r.low, r.high, step=r.step)
            else:
                params[axis.name] = trial.suggest_categorical(axis.name, list(axis.choices))
        return params

    @staticmethod
    def to_study(params: dict[str, Any]) -> dict[str, Any]:
        """A candidate's parameters (with `budget`, if any) as the study records them."""
        folded = {d.name for d in AXES if d.tag is not None} | {VARIANT}
        residual = encode_residual(params[VARIANT], {k: params[k] for k in params if k in folded})
        return {RESIDUAL: residual} | {k: v for k, v in params.items() if k not in folded}

    @staticmethod
    def from_study(params: dict[str, Any]) -> dict[str, Any]:
        """The inverse of `to_study`: a trial's parameters as a candidate's (and `budget`),
        the joint training axes left out (they are not the architecture's).
        Raises ValueError for a `residual` this codec never writes."""
        rest = {k: v for k, v in params.items() if k != RESIDUAL and k not in TRAINING_AXES}
        return decode_residual(str(params[RESIDUAL])) | rest


#: What separates a `residual`'s variant from each of its parts, and a part's tag from its value.
PART_SEPARATOR, TAG_SEPARATOR = "/", "="


def residual_codec() -> dict[str, Any]:
    """The codec of `encode_residual` as data, for a client that writes or reads the labels
    (the dashboard): the separators, and per conditional axis its tag, its parameter (an
    `ArchConfig` field), the `SearchSpace` field holding its values and the variants it
    belongs to, in the order the parts are written."""
    return {
        "separator": PART_SEPARATOR,
        "assign": TAG_SEPARATOR,
        "parts": [
            {
                "tag": d.tag,
                "field": d.name,
                "space_field": d.field,
                "variants": sorted(d.variants or ()),
            }
            for d in AXES
            if d.tag is not None
        ],
    }


def encode_residual(variant: str, values: dict[str, Any]) -> str:
    """The study's `residual` for a variant and its conditional axes (`block_attnres/S=4`);
    `values` may hold other parameters, only the variant's conditional ones are written."""
    parts = [variant]
    for d in AXES:
        if d.tag is not None and d.variants is not None and variant in d.variants:
            parts.append(f"{d.tag}{TAG_SEPARATOR}{values[d.name]}")
    return PART_SEPARATOR.join(parts)


def decode_residual(value: str) -> dict[str, Any]:
    """The inverse of `encode_residual`: `{"variant": ..., <conditional axis>: ...}`.
    Raises ValueError naming what is wrong with a string the codec never writes."""
    variant, *items = value.split(PART_SEPARATOR)
    out: dict[str, Any] = {VARIANT: variant}
    for item in items:
        tag, sep, text = item.partition(TAG_SEPARATOR)
        d = _BY_TAG.get(tag)
        if not sep or d is None:
            raise ValueError(f"residual {value!r}: unknown part {item!r}")
        if d.variants is not None and variant not in d.variants:
            raise ValueError(f"residual {value!r}: {variant!r} has no {d.name} ({tag})")
        if d.name in out:
            raise ValueError(f"residual {value!r}: {tag} given twice")
        if d.kind != "int" or not text.isdigit() or not text.isascii():
            raise ValueError(f"residual {value!r}: {tag} must be a whole number, got {text!r}")
        out[d.name] = int(text)
    needed = [d.tag for d in AXES if d.tag and d.variants and variant in d.variants]
    absent = [t for t in needed if _BY_TAG[t].name not in out]
    if absent:
        raise ValueError(f"residual {value!r}: {variant} needs {', '.join(absent)}")
    return out
