"""The job spec: a search space over depth, width, heads, residual variant and block size, a
fixed compute budget per candidate, objectives, constraints, and how to search.

The same pydantic model is what the HTTP API accepts and what `depthscope submit` reads from
YAML. `JobSpec` checks everything a spec can check on its own; `check_job(spec, settings)`
adds what needs the service's settings (limits, cluster names) and the cost model (a space
with no valid candidate, a budget too small for one optimizer step). Every refusal names the
field and the reason (`SpecError`), and nothing is stored on refusal.

A spec may come from a stranger, so everything in it is bounded: every number is finite (no
NaN or infinity, from JSON or YAML), every integer that sizes an allocation has a ceiling
(here, or an operator limit of `Settings` checked by `check_job`), strings hold no NUL bytes or
control characters, a range is counted arithmetically and never expanded before its bound is
checked, a corpus is read only from where the operator allows (`resolve_corpus`), and YAML is
read with a size cap and without anchors or aliases (`load_yaml_text`).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cost_model import (
    METRICS,
    VARIANTS,
    ArchConfig,
    CostInputError,
    Parallelism,
    Workload,
    flops_for_tokens,
    get_hardware,
    tokens_for_budget,
    width_for_params,
)
from nas_service.settings import Settings

LOSS = "val_loss"
OBJECTIVE_METRICS: tuple[str, ...] = (LOSS, *METRICS)

#: Ceilings of the fields that size something and have no operator limit in `Settings`.
MAX_SEED = 2**32 - 1  # Optuna's and numpy's seeds are 32-bit
MAX_ASPECT_RATIO = 1e6
MAX_EVALS = 10_000  # validation points per run (n_evals) and batches per point
MAX_VOCAB = 1 << 24  # embedding rows: far above any tokenizer in use
MAX_LAYOUT = 4096  # tensor and pipeline ranks, virtual stages
MAX_MICROBATCHES = 1 << 20
MAX_FF_RATIO = 64.0
MAX_LR = 1e3
MAX_CONSTRAINTS = 64
#: A YAML spec file: at most this many bytes, at most this deep.
MAX_SPEC_BYTES = 1 << 20
MAX_YAML_DEPTH = 64


class SpecError(ValueError):
    """A refused job spec: `errors` is a list of (field, reason), the first also as attributes."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        self.field, self.reason = errors[0]
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (Ray, multiprocessing)
        return (type(self), (self.errors,))


def _check_text(value: str) -> str:
    """Refuse NUL bytes, other control characters (tab and newline included) and lone
    surrogates: PostgreSQL refuses NUL in text, and none of them belongs in a name or path."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            what = "a NUL byte" if ch == "\0" else f"the control character U+{ord(ch):04X}"
            raise ValueError(f"contains {what} at position {i}; only printable text is accepted")
    return value


#: A string from a spec: printable text only.
Text = Annotated[str, AfterValidator(_check_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IntRange(_Strict):
    """low, low + step, …, up to high (inclusive). Counted arithmetically (`count`, `last`):
    only `values()` expands it, and only after `check_job` has bounded it."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.high < self.low:
            raise ValueError(f"inverted range: high {self.high} < low {self.low}")
        return self

    @property
    def count(self) -> int:
        """How many values, without building them."""
        return (self.high - self.low) // self.step + 1

    @property
    def last(self) -> int:
        """The largest value (high, or below it when the step does not land on it)."""
        return self.low + (self.count - 1) * self.step

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


def _axis_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | IntRange) else "choices"


#: Either explicit choices `[2, 4, 8]` or a range `{low: 2, high: 8, step: 2}`.
IntAxis = Annotated[
    Annotated[IntRange, Tag("range")] | Annotated[list[int], Tag("choices")],
    Discriminator(_axis_kind),
]


def axis_values(axis: IntAxis | None) -> list[int]:
    """The values of an axis, expanded: call it on a spec `check_job` accepted (a range is
    bounded there); use `axis_count` and `axis_max` to size an axis."""
    if axis is None:
        return []
    return axis.values() if isinstance(axis, IntRange) else list(axis)


def axis_count(axis: IntAxis | None) -> int:
    """The number of values of an axis (0 for None), without expanding a range."""
    if axis is None:
        return 0
    return axis.count if isinstance(axis, IntRange) else len(axis)


def axis_max(axis: IntAxis | None) -> int | None:
    """The largest value of an axis (None for None), without expanding a range."""
    if axis is None:
        return None
    return axis.last if isinstance(axis, IntRange) else max(axis)


def _check_choices(values: list[Any], positive: bool = True) -> list[Any]:
    if not values:
        raise ValueError("empty: give at least one value")
    if len(set(values)) != len(values):
        raise ValueError("duplicate values")
    if positive and any(v <= 0 for v in values):
        raise ValueError("values must be positive")
    return values


def _one_or_many(value: Any) -> str:
    return "choices" if isinstance(value, list | tuple) else "single"


def _integral_floats(value: Any) -> Any:
    """Whole-valued floats (1e13 from JSON) become ints before int validation, whatever
    their size, so that an over-large count is refused against its limit rather than as a
    parse error; other values are left to pydantic."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


#: A budget: one value, or several (a searched axis).
FloatBudget = Annotated[
    Annotated[float, Tag("single")] | Annotated[list[float], Tag("choices")],
    Discriminator(_one_or_many),
]
IntBudget = Annotated[
    Annotated[int, Tag("single")] | Annotated[list[int], Tag("choices")],
    Discriminator(_one_or_many),
]


class ParamsTarget(_Strict):
    """A fixed parameter count: the width follows from the depth (`cost_model.budget`)."""

    params: float = Field(gt=0)
    tolerance: float = Field(default=0.1, gt=0, le=1)


class ArchDefaults(_Strict):
    """The architecture fields that are not searched."""

    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    positions: Literal["rope", "learned"] = "rope"
    bias: bool = False
    tie_embeddings: bool = True
    ff_ratio: float | None = Field(default=None, gt=0, le=MAX_FF_RATIO)
    mhc_streams: int | None = Field(default=None, ge=2, le=6)


class SearchSpace(_Strict):
    """Depth (Transformer blocks), then exactly one way to set the width: `d_model` choices,
    a `params_target`, or `aspect_ratio` choices (d_model / n_layers, rounded to a multiple
    of the head dimension). Heads: `n_heads` choices, else d_model / `head_dim`."""

    n_layers: IntAxis
    d_model: IntAxis | None = None
    params_target: ParamsTarget | None = None
    aspect_ratio: list[float] | None = None
    n_heads: IntAxis | None = None
    head_dim: int = Field(default=64, ge=2)
    variants: list[Text] = Field(default_factory=lambda: ["baseline"])
    block_sizes: IntAxis | None = None
    arch: ArchDefaults = Field(default_factory=ArchDefaults)

    @field_validator("n_layers", "d_model", "n_heads", "block_sizes")
    @classmethod
    def _axis(cls, value: IntAxis | None) -> IntAxis | None:
        if isinstance(value, list):
            _check_choices(value)
        return value

    @field_validator("aspect_ratio")
    @classmethod
    def _ratios(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return None
        _check_choices(value)
        if any(v > MAX_ASPECT_RATIO for v in value):
            raise ValueError(f"values must be at most {MAX_ASPECT_RATIO:g}")
        return value

    @field_validator("variants")
    @classmethod
    def _variants(cls, value: list[str]) -> list[str]:
        _check_choices(value, positive=False)
        unknown = [v for v in value if v not in VARIANTS]
        if unknown:
            raise ValueError(
                f"unknown variant {unknown[0]!r}; expected one of {', '.join(VARIANTS)}"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpace:
        widths = [
            self.d_model is not None,
            self.params_target is not None,
            self.aspect_ratio is not None,
        ]
        if sum(widths) != 1:
            raise ValueError("give exactly one of d_model, params_target and aspect_ratio")
        if "block_attnres" in self.variants and self.block_sizes is None:
            raise ValueError("block_sizes: needed when variants include block_attnres")
        if self.block_sizes is not None and "block_attnres" not in self.variants:
            raise ValueError("block_sizes: only block_attnres has a block size")
        return self


class Budget(_Strict):
    """Per candidate: training FLOPs (causal count) or training tokens, exactly one. A list
    makes the budget a searched axis (a scaling-law job over several budgets)."""

    flops: FloatBudget | None = None
    tokens: IntBudget | None = None

    @field_validator("flops", "tokens", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse NaN and infinities (also as strings, "NaN" from a JSON file read as YAML)
        and fractional token counts on the budget's own field, every value of a list
        included; whole-valued floats become token counts."""
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, bool):
                raise ValueError(f"must be a number, not {str(v).lower()}")
            number = v
            if isinstance(v, str):
                try:
                    number = float(v)
                except ValueError:
                    continue  # not a number: pydantic says so
            if not isinstance(number, float):
                continue
            if not math.isfinite(number):
                raise ValueError(f"must be a finite number, got {number}")
            if info.field_name == "tokens" and not number.is_integer():
                raise ValueError(f"must be a whole number of tokens, got {number:g}")
        return _integral_floats(value) if info.field_name == "tokens" else value

    @field_validator("flops", "tokens")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        if isinstance(value, list):
            _check_choices(value)
        elif value is not None and not value > 0:
            raise ValueError("must be greater than 0")
        return value

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if (self.flops is None) == (self.tokens is None):
            raise ValueError("give exactly one of flops and tokens")
        return self

    @property
    def kind(self) -> str:
        return "flops" if self.flops is not None else "tokens"

    def values(self) -> list[float]:
        return [float(v) for v in self.raw_values()]

    def raw_values(self) -> list[int | float]:
        """The budgets as given (tokens stay ints, however large)."""
        raw = self.flops if self.flops is not None else self.tokens
        if isinstance(raw, list):
            return list(raw)
        return [] if raw is None else [raw]


class Constraint(_Strict):
    """A cap on a cost-model metric; a candidate over it is never trained."""

    metric: Text
    max: float = Field(gt=0)

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of {', '.join(METRICS)}")
        return value


class Training(_Strict):
    """How every candidate is trained (see `workers.train.TrainSpec`). seq_len, batch_size
    and threads are bounded by the operator's limits (`check_job`); the corpus is a name
    registered by the operator or a path inside the data folder (`resolve_corpus`)."""

    corpus: Text | None = Field(default=None, min_length=1, max_length=4096)  # None: built-in
    vocab_size: int = Field(default=256, ge=2, le=MAX_VOCAB)
    seq_len: int = Field(default=128, ge=2)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0, le=MAX_LR)
    schedule: Literal["cosine", "wsd"] = "cosine"
    warmup_frac: float = Field(default=0.05, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0, le=MAX_LR)
    n_evals: int = Field(default=8, ge=1, le=MAX_EVALS)
    eval_batches: int = Field(default=8, ge=1, le=MAX_EVALS)
    threads: int | None = Field(default=None, ge=1)


class CostContext(_Strict):
    """The workload, layout and hardware the cost metrics are computed for."""

    hardware: Text = Field(default="h100", max_length=64)
    micro_batch: int = Field(default=8, ge=1)
    seq_len: int | None = Field(default=None, ge=1)  # None: the training seq_len
    microbatches: int = Field(default=1, ge=1, le=MAX_MICROBATCHES)
    recompute: Literal["none", "selective", "full"] = "none"
    tensor: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    pipeline: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    virtual: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    decode_context: int | None = Field(default=None, ge=1)

    @field_validator("hardware")
    @classmethod
    def _preset(cls, value: str) -> str:
        try:
            get_hardware(value)
        except CostInputError as exc:
            raise ValueError(exc.reason) from None
        return value.lower()

    def workload(self, training: Training) -> Workload:
        return Workload(
            micro_batch=self.micro_batch,
            seq_len=self.seq_len or training.seq_len,
            microbatches=self.microbatches,
            recompute=self.recompute,
            decode_context=self.decode_context,
        )

    def parallelism(self) -> Parallelism:
        try:
            return Parallelism(tensor=self.tensor, pipeline=self.pipeline, virtual=self.virtual)
        except CostInputError as exc:
            raise ValueError(str(exc)) from None


class JobSpec(_Strict):
    name: Text = Field(min_length=1, max_length=200)
    space: SearchSpace
    budget: Budget
    objectives: list[Text] = Field(default_factory=lambda: [LOSS])
    constraints: list[Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    sampler: Literal["tpe", "nsga2", "random", "grid"] = "tpe"
    pruner: Literal["auto", "none", "median", "pareto"] = "auto"
    n_trials: int = Field(ge=1)  # ≤ max_trials (check_job)
    max_concurrent: int = Field(default=2, ge=1)  # ≤ max_concurrent_trials (check_job)
    seeds: int = Field(default=1, ge=1)  # ≤ max_seeds (check_job)
    sampler_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    training: Training = Field(default_factory=Training)
    cost: CostContext = Field(default_factory=CostContext)
    cluster: Text = Field(default="local", min_length=1, max_length=100)

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, value: list[str]) -> list[str]:
        _check_choices(value, positive=False)
        unknown = [m for m in value if m not in OBJECTIVE_METRICS]
        if unknown:
            raise ValueError(
                f"unknown metric {unknown[0]!r}; expected val_loss or one of {', '.join(METRICS)}"
            )
        return value

    @model_validator(mode="after")
    def _layout(self) -> JobSpec:
        self.cost.parallelism()
        if self.pruner == "median" and len(self.objectives) > 1:
            raise ValueError("pruner: median needs a single objective; use pareto or auto")
        return self

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def parse_spec(data: Any) -> JobSpec:
    """A `JobSpec` from plain data, or `SpecError` listing every (field, reason)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_errors(exc)) from None


_UNION_TAGS = frozenset({"range", "choices", "single"})


def _printable(text: str) -> str:
    """`text` with non-printable characters escaped (a field name may be a stranger's key)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(_printable(str(p)) for p in err["loc"] if p not in _UNION_TAGS)
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append((loc or "spec", msg))
    return out


# -- YAML -------------------------------------------------------------------------------------
class _Refused(yaml.YAMLError):
    def __init__(self, reason: str, mark: Any) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(reason + where)
        self.reason = reason + where


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases (a few hundred bytes of nested
    aliases expand to gigabytes once serialised: "billion laughs") and with a nesting limit
    (the composer recurses)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused("YAML anchors and aliases are not accepted", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"YAML nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.1 reads `5e11` (no dot) as a string; specs write budgets that way, so floats in
# exponent form without a dot resolve as floats, as YAML 1.2 and JSON read them.
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml_text(text: str, source: str = "spec") -> Any:
    """Parse a YAML (or JSON) document from a stranger: at most `MAX_SPEC_BYTES` (refused
    before parsing), no anchors or aliases, at most `MAX_YAML_DEPTH` levels deep, safe tags
    only. `source` names the text in messages. Raises `SpecError` on field "spec"."""
    size = len(text) if len(text) > MAX_SPEC_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            [("spec", f"{source} is over the limit of {MAX_SPEC_BYTES} bytes for a spec")]
        )
    loader = _SpecLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise SpecError([("spec", exc.reason)]) from None
    except yaml.YAMLError as exc:
        raise SpecError([("spec", f"{source} is not valid YAML: {exc}")]) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise SpecError([("spec", f"{source} is not a usable spec: {exc}")]) from None
    finally:
        loader.dispose()


def read_spec_data(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML (or JSON) spec file, read with `load_yaml_text`'s bounds (no
    more than `MAX_SPEC_BYTES` + 1 bytes are read). Raises `SpecError` on field "spec"."""
    p = Path(path)
    shown = repr(str(p))
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([("spec", f"file {shown} does not exist")]) from None
    except OSError as exc:
        raise SpecError([("spec", f"cannot read {shown}: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            [("spec", f"{shown} is over the limit of {MAX_SPEC_BYTES} bytes for a spec")]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([("spec", f"cannot read {shown}: {exc}")]) from None
    data = load_yaml_text(text, shown)
    if not isinstance(data, dict):
        raise SpecError([("spec", f"{shown} must hold a mapping of fields")])
    return data


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML (or JSON) job spec file (`read_spec_data`) and validate it."""
    return parse_spec(read_spec_data(path))


# -- candidates -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One point of the space: its parameters (as the study records them) and its arch, or
    the reason it is not a valid architecture."""

    params: dict[str, Any]
    arch: ArchConfig | None
    reason: str = ""


def base_arch(spec: JobSpec) -> dict[str, Any]:
    defaults = spec.space.arch
    return {
        "vocab_size": spec.training.vocab_size,
        "seq_len": spec.training.seq_len,
        "mlp": defaults.mlp,
        "norm": defaults.norm,
        "positions": defaults.positions,
        "bias": defaults.bias,
        "tie_embeddings": defaults.tie_embeddings,
        "ff_ratio": defaults.ff_ratio,
    }


def space_axes(spec: JobSpec) -> dict[str, list[Any]]:
    """The searched parameters and their choices, in a fixed order."""
    space = spec.space
    axes: dict[str, list[Any]] = {
        "variant": list(space.variants),
        "n_layers": axis_values(space.n_layers),
    }
    if space.d_model is not None:
        axes["d_model"] = axis_values(space.d_model)
    if space.aspect_ratio is not None:
        axes["aspect_ratio"] = list(space.aspect_ratio)
    if space.n_heads is not None:
        axes["n_heads"] = axis_values(space.n_heads)
    if space.block_sizes is not None:
        axes["block_size"] = axis_values(space.block_sizes)
    return axes


def build_candidate(spec: JobSpec, params: dict[str, Any]) -> Candidate:
    """The architecture for one set of searched parameters (a conditional `block_size` is
    ignored unless the variant is block_attnres)."""
    space = spec.space
    variant = params["variant"]
    n_layers = int(params["n_layers"])
    fields = base_arch(spec) | {"n_layers": n_layers, "variant": variant}
    if variant == "block_attnres":
        fields["block_size"] = int(params["block_size"])
    if variant == "mhc_lite":
        fields["mhc_streams"] = space.arch.mhc_streams
    try:
        if space.params_target is not None:
            template = ArchConfig(**(fields | {"d_model": space.head_dim * 2, "n_heads": 2}))
            arch = width_for_params(template, n_layers, space.params_target.params, space.head_dim)
            error = (
                abs(_total_params(arch) - space.params_target.params) / space.params_target.params
            )
            if error > space.params_target.tolerance:
                return Candidate(
                    params, None, f"params_target: nearest width misses by {error:.0%}"
                )
            if "n_heads" in params:
                arch = arch.replace(n_heads=int(params["n_heads"]))
            return Candidate(params, arch)
        if "aspect_ratio" in params:
            steps = max(1, round(float(params["aspect_ratio"]) * n_layers / space.head_dim))
            d_model = steps * space.head_dim
        else:
            d_model = int(params["d_model"])
        heads = int(params["n_heads"]) if "n_heads" in params else max(1, d_model // space.head_dim)
        return Candidate(params, ArchConfig(**(fields | {"d_model": d_model, "n_heads": heads})))
    except CostInputError as exc:
        return Candidate(params, None, str(exc))


def _total_params(arch: ArchConfig) -> int:
    from cost_model import param_count

    return int(param_count(arch).total)


def enumerate_candidates(spec: JobSpec, limit: int | None = None) -> Iterator[Candidate]:
    """Every point of the (discrete) space; `block_size` only varies for block_attnres.

    With `limit`, a space of more candidates is refused (`SpecError` on "space") before
    anything is expanded; without one, call it on a spec `check_job` accepted."""
    if limit is not None and space_size(spec) > limit:
        raise SpecError([("space", f"more than {limit} candidates; narrow the space")])
    axes = space_axes(spec)
    for variant in axes["variant"]:
        names = [
            n for n in axes if n != "variant" and (n != "block_size" or variant == "block_attnres")
        ]
        for combo in itertools.product(*(axes[n] for n in names)):
            yield build_candidate(
                spec, {"variant": variant, **dict(zip(names, combo, strict=True))}
            )


def space_size(spec: JobSpec) -> int:
    """The number of candidates, counted arithmetically (nothing is expanded)."""
    space = spec.space
    other = axis_count(space.n_layers)
    if space.d_model is not None:
        other *= axis_count(space.d_model)
    if space.aspect_ratio is not None:
        other *= len(space.aspect_ratio)
    if space.n_heads is not None:
        other *= axis_count(space.n_heads)
    blocks = axis_count(space.block_sizes) if space.block_sizes is not None else 1
    return sum(other * (blocks if v == "block_attnres" else 1) for v in space.variants)


def _fmt(value: float) -> str:
    """A number for a message: ints as digits while short, otherwise %g."""
    if isinstance(value, int):
        if value.bit_length() <= 50:
            return str(value)
        try:
            return f"{float(value):g}"
        except OverflowError:
            return "more than 1e308"
    return f"{value:g}"


def _over(field: str, value: float, limit: float) -> tuple[str, str]:
    return (field, f"{_fmt(value)} is over the limit of {_fmt(limit)}")


# -- corpora ----------------------------------------------------------------------------------
_CORPUS = "training.corpus"
_BUILTIN = "builtin"  # workers.data.BUILTIN (not imported here: workers.data loads torch)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_corpus(corpus: str | None, settings: Settings) -> str | None:
    """Where `training.corpus` may be read from, as an absolute path with symbolic links
    resolved, or None for the built-in corpus (None or "builtin").

    A name registered in `settings.corpora` gives that path (a relative one is taken inside
    `settings.data_dir`). Anything else is a path inside `settings.data_dir`: relative to it,
    or absolute and lying in it. It must exist, be a regular file or a folder, and still lie
    inside the data folder once every symbolic link is followed. Otherwise `SpecError` on
    "training.corpus" says why, and never whether a path outside the data folder exists.
    The service calls it in `check_job`; the runner calls it again before training."""
    if corpus is None:
        return None
    try:
        _check_text(corpus)
    except ValueError as exc:
        raise SpecError([(_CORPUS, str(exc))]) from None
    if corpus in settings.corpora:
        return _registered_corpus(corpus, settings)
    if corpus == _BUILTIN:
        return None
    shown = repr(corpus)
    registered = ", ".join(sorted(settings.corpora))
    outside = SpecError(
        [
            (
                _CORPUS,
                f"{shown} is not a registered corpus and not a path inside the data folder"
                + (f" (registered: {registered})" if registered else ""),
            )
        ]
    )
    escapes = SpecError([(_CORPUS, f"{shown} leads outside the data folder (a symbolic link)")])
    root_given = settings.data_dir.expanduser().absolute()
    root = Path(os.path.realpath(root_given))
    raw = Path(corpus)
    target = raw if raw.is_absolute() else root / raw
    lexical = Path(os.path.normpath(target))
    if not (_inside(lexical, root) or _inside(lexical, Path(os.path.normpath(root_given)))):
        raise outside  # decided on the text alone: nothing outside is looked at
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a loop, a file used as a folder, no access
        try:
            loose = target.resolve(strict=False)
        except (OSError, RuntimeError):
            loose = lexical
        if not _inside(loose, root):
            raise escapes from None
        raise SpecError(
            [
                (
                    _CORPUS,
                    f"{shown} is not a registered corpus and does not exist in the data folder"
                    + (f" (registered: {registered})" if registered else ""),
                )
            ]
        ) from None
    if not _inside(real, root):
        raise escapes
    if real == root:
        raise SpecError(
            [(_CORPUS, f"{shown} is the data folder itself; name a file or folder inside it")]
        )
    if not (real.is_file() or real.is_dir()):
        raise SpecError([(_CORPUS, f"{shown} is not a regular file or a folder")])
    return str(real)


def _registered_corpus(name: str, settings: Settings) -> str:
    path = settings.corpora[name].expanduser()
    if not path.is_absolute():
        path = settings.data_dir.expanduser().absolute() / path
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        real = None
    if real is None or not (real.is_file() or real.is_dir()):
        raise SpecError(
            [(_CORPUS, f"the registered corpus {name!r} is not available on this service")]
        )
    return str(real)


# -- the job against the settings -------------------------------------------------------------
def _limits(spec: JobSpec, settings: Settings) -> list[tuple[str, str]]:
    """Every operator limit that can be checked without building a candidate (nothing here
    grows with a range's width)."""
    errors: list[tuple[str, str]] = []
    s = settings
    if spec.n_trials > s.max_trials:
        errors.append(_over("n_trials", spec.n_trials, s.max_trials))
    budgets = spec.budget.raw_values()
    field = f"budget.{spec.budget.kind}"
    limit = s.max_budget_flops if spec.budget.kind == "flops" else s.max_budget_tokens
    if max(budgets) > limit:
        errors.append(_over(field, max(budgets), limit))
    if len(budgets) > s.max_axis_values:
        errors.append(
            (field, f"{len(budgets)} values, over the limit of {s.max_axis_values} per axis")
        )
    if spec.max_concurrent > s.max_concurrent_trials:
        errors.append(_over("max_concurrent", spec.max_concurrent, s.max_concurrent_trials))
    if spec.seeds > s.max_seeds:
        errors.append(_over("seeds", spec.seeds, s.max_seeds))
    if spec.cluster not in s.clusters:
        errors.append(
            (
                "cluster",
                f"unknown cluster {spec.cluster!r}; configured: {', '.join(s.clusters)}",
            )
        )
    size = space_size(spec)
    if size > s.max_candidates_enumerated:
        errors.append(
            (
                "space",
                f"more than {s.max_candidates_enumerated} candidates ({_fmt(size)}); "
                "narrow the space",
            )
        )
    space = spec.space
    axes: list[tuple[str, IntAxis | None, int]] = [
        ("n_layers", space.n_layers, s.max_n_layers),
        ("d_model", space.d_model, s.max_d_model),
        ("n_heads", space.n_heads, s.max_d_model),
        ("block_sizes", space.block_sizes, 2 * s.max_n_layers),  # S counts sublayers
    ]
    for name, axis, top in axes:
        if axis is None:
            continue
        count = axis_count(axis)
        if count > s.max_axis_values:
            errors.append(
                (
                    f"space.{name}",
                    f"{_fmt(count)} values, over the limit of {s.max_axis_values} per axis",
                )
            )
        largest = axis_max(axis)
        if largest is not None and largest > top:
            errors.append(_over(f"space.{name}", largest, top))
    if space.aspect_ratio is not None and len(space.aspect_ratio) > s.max_axis_values:
        errors.append(
            (
                "space.aspect_ratio",
                f"{len(space.aspect_ratio)} values, over the limit of {s.max_axis_values} per axis",
            )
        )
    if space.head_dim > s.max_d_model:
        errors.append(_over("space.head_dim", space.head_dim, s.max_d_model))
    if space.params_target is not None and space.params_target.params > s.max_params:
        errors.append(_over("space.params_target.params", space.params_target.params, s.max_params))
    training, cost = spec.training, spec.cost
    if training.seq_len > s.max_seq_len:
        errors.append(_over("training.seq_len", training.seq_len, s.max_seq_len))
    if training.batch_size > s.max_batch_size:
        errors.append(_over("training.batch_size", training.batch_size, s.max_batch_size))
    if training.threads is not None and training.threads > s.max_threads:
        errors.append(_over("training.threads", training.threads, s.max_threads))
    if cost.seq_len is not None and cost.seq_len > s.max_seq_len:
        errors.append(_over("cost.seq_len", cost.seq_len, s.max_seq_len))
    if cost.decode_context is not None and cost.decode_context > s.max_seq_len:
        errors.append(_over("cost.decode_context", cost.decode_context, s.max_seq_len))
    if cost.micro_batch > s.max_batch_size:
        errors.append(_over("cost.micro_batch", cost.micro_batch, s.max_batch_size))
    try:
        resolve_corpus(training.corpus, settings)
    except SpecError as exc:
        errors.extend(exc.errors)
    return errors


def _describe(candidate: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in candidate.params.items())


def _candidate_limits(
    spec: JobSpec, valid: list[Candidate], settings: Settings
) -> list[tuple[str, str]]:
    """The limits on what the candidates turned out to be: width, parameters, and the
    estimated compute of the whole job."""
    errors: list[tuple[str, str]] = []
    archs = [(c, c.arch) for c in valid if c.arch is not None]
    width_field = "space.aspect_ratio" if spec.space.aspect_ratio is not None else "space"
    if spec.space.params_target is not None:
        width_field = "space.params_target"
    widest, widest_arch = max(archs, key=lambda t: t[1].d_model)
    if widest_arch.d_model > settings.max_d_model:
        errors.append(
            (
                width_field,
                f"the candidate {_describe(widest)} has d_model {widest_arch.d_model}, "
                f"over the limit of {settings.max_d_model}",
            )
        )
    params = [(_total_params(a), c) for c, a in archs]
    most, biggest = max(params, key=lambda t: t[0])
    if most > settings.max_params:
        errors.append(
            (
                "space",
                f"the candidate {_describe(biggest)} has {most:.3g} parameters, over the "
                f"limit of {_fmt(settings.max_params)}",
            )
        )
    budgets = spec.budget.raw_values()
    if spec.budget.kind == "flops":
        per_run = float(max(budgets))
    else:
        per_run = max(flops_for_tokens(a, int(max(budgets))) for _, a in archs)
    job = spec.n_trials * spec.seeds * per_run
    if job > settings.max_job_flops:
        errors.append(
            (
                "budget",
                f"the job's estimated compute, n_trials × seeds × {per_run:.3g} FLOPs = "
                f"{job:.3g} FLOPs, is over the limit of {_fmt(settings.max_job_flops)}",
            )
        )
    return errors


def check_job(spec: JobSpec, settings: Settings) -> list[Candidate]:
    """What needs the settings and the cost model. Returns the valid candidates; raises
    `SpecError` for anything over the operator's limits (n_trials, budget, concurrency,
    seeds, the size of the space and of each axis, depth, width, heads, sequence length,
    batch size, threads, parameters per candidate, the estimated compute of the job), an
    unknown cluster, a corpus from outside the data folder, a space with no valid candidate,
    or a budget too small for one optimizer step of the smallest candidate.

    Everything that can be checked arithmetically is checked before any candidate is built,
    so a hostile range costs nothing."""
    errors = _limits(spec, settings)
    if errors:
        raise SpecError(errors)
    candidates = list(enumerate_candidates(spec, settings.max_candidates_enumerated))
    valid = [c for c in candidates if c.arch is not None]
    if not valid:
        reasons = sorted({c.reason for c in candidates})
        raise SpecError([("space", "no valid candidate: " + "; ".join(reasons[:3]))])
    errors = _candidate_limits(spec, valid, settings)
    if errors:
        raise SpecError(errors)
    budgets = spec.budget.values()
    step_tokens = spec.training.batch_size * spec.training.seq_len
    if spec.budget.kind == "flops":
        best = max(tokens_for_budget(c.arch, min(budgets)) for c in valid if c.arch)
        if best < step_tokens:
            raise SpecError(
                [
                    (
                        "budget.flops",
                        f"buys at most {best} tokens, fewer than one optimizer step "
                        f"({step_tokens} = batch_size × seq_len) of the smallest candidate",
                    )
                ]
            )
    elif min(budgets) < step_tokens:
        raise SpecError(
            [
                (
                    "budget.tokens",
                    f"{int(min(budgets))} is fewer than one optimizer step ({step_tokens})",
                )
            ]
        )
    return valid
