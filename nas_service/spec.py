"""The job spec: a search space over depth, width, heads, residual variant and block size, a
fixed compute budget per candidate, objectives, constraints, and how to search.

The same pydantic model is what the HTTP API accepts and what `depthscope submit` reads from
YAML. `JobSpec` checks everything a spec can check on its own; `check_job(spec, settings)`
adds what needs the service's settings (limits, cluster names) and the cost model (a space
with no valid candidate, a budget too small for one optimizer step). Every refusal names the
field and the reason (`SpecError`), and nothing is stored on refusal.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
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
    get_hardware,
    tokens_for_budget,
    width_for_params,
)
from nas_service.settings import Settings

LOSS = "val_loss"
OBJECTIVE_METRICS: tuple[str, ...] = (LOSS, *METRICS)


class SpecError(ValueError):
    """A refused job spec: `errors` is a list of (field, reason), the first also as attributes."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        self.field, self.reason = errors[0]
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(_Strict):
    """low, low + step, …, up to high (inclusive)."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.high < self.low:
            raise ValueError(f"inverted range: high {self.high} < low {self.low}")
        return self

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
    if axis is None:
        return []
    return axis.values() if isinstance(axis, IntRange) else list(axis)


def _check_choices(values: list[Any], positive: bool = True) -> list[Any]:
    if not values:
        raise ValueError("empty: give at least one value")
    if len(set(values)) != len(values):
        raise ValueError("duplicate values")
    if positive and any(v <= 0 for v in values):
        raise ValueError("values must be positive")
    return values


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
    ff_ratio: float | None = Field(default=None, gt=0)
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
    variants: list[str] = Field(default_factory=lambda: ["baseline"])
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
        return None if value is None else _check_choices(value)

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

    flops: float | list[float] | None = None
    tokens: int | list[int] | None = None

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
        raw = self.flops if self.flops is not None else self.tokens
        return [float(v) for v in (raw if isinstance(raw, list) else [raw])]  # type: ignore[union-attr]


class Constraint(_Strict):
    """A cap on a cost-model metric; a candidate over it is never trained."""

    metric: str
    max: float = Field(gt=0)

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of {', '.join(METRICS)}")
        return value


class Training(_Strict):
    """How every candidate is trained (see `workers.train.TrainSpec`)."""

    corpus: str | None = None  # None: the built-in corpus
    vocab_size: int = Field(default=256, ge=2)
    seq_len: int = Field(default=128, ge=2)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    schedule: Literal["cosine", "wsd"] = "cosine"
    warmup_frac: float = Field(default=0.05, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0)
    n_evals: int = Field(default=8, ge=1)
    eval_batches: int = Field(default=8, ge=1)
    threads: int | None = Field(default=None, ge=1)


class CostContext(_Strict):
    """The workload, layout and hardware the cost metrics are computed for."""

    hardware: str = "h100"
    micro_batch: int = Field(default=8, ge=1)
    seq_len: int | None = Field(default=None, ge=1)  # None: the training seq_len
    microbatches: int = Field(default=1, ge=1)
    recompute: Literal["none", "selective", "full"] = "none"
    tensor: int = Field(default=1, ge=1)
    pipeline: int = Field(default=1, ge=1)
    virtual: int = Field(default=1, ge=1)
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
    name: str = Field(min_length=1, max_length=200)
    space: SearchSpace
    budget: Budget
    objectives: list[str] = Field(default_factory=lambda: [LOSS])
    constraints: list[Constraint] = Field(default_factory=list)
    sampler: Literal["tpe", "nsga2", "random", "grid"] = "tpe"
    pruner: Literal["auto", "none", "median", "pareto"] = "auto"
    n_trials: int = Field(ge=1)
    max_concurrent: int = Field(default=2, ge=1)
    seeds: int = Field(default=1, ge=1)
    sampler_seed: int = 0
    training: Training = Field(default_factory=Training)
    cost: CostContext = Field(default_factory=CostContext)
    cluster: str = "local"

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


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if p not in ("range", "choices"))
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append((loc or "spec", msg))
    return out


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML (or JSON) job spec file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([("spec", f"file {str(p)!r} does not exist")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("spec", f"cannot read {str(p)!r}: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("spec", f"{str(p)!r} is not valid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([("spec", f"{str(p)!r} must hold a mapping of fields")])
    return parse_spec(data)


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
    """Every point of the (discrete) space; `block_size` only varies for block_attnres."""
    axes = space_axes(spec)
    count = 0
    for variant in axes["variant"]:
        names = [
            n for n in axes if n != "variant" and (n != "block_size" or variant == "block_attnres")
        ]
        for combo in itertools.product(*(axes[n] for n in names)):
            count += 1
            if limit is not None and count > limit:
                raise SpecError([("space", f"more than {limit} candidates; narrow the space")])
            yield build_candidate(
                spec, {"variant": variant, **dict(zip(names, combo, strict=True))}
            )


def space_size(spec: JobSpec) -> int:
    axes = space_axes(spec)
    other = math.prod(len(v) for n, v in axes.items() if n not in ("variant", "block_size"))
    blocks = len(axes.get("block_size", [1]))
    return sum(other * (blocks if v == "block_attnres" else 1) for v in axes["variant"])


def check_job(spec: JobSpec, settings: Settings) -> list[Candidate]:
    """What needs the settings and the cost model. Returns the valid candidates; raises
    `SpecError` for n_trials, budget or concurrency over the limits, an unknown cluster, a
    space with no valid candidate, or a budget too small for one optimizer step of the
    smallest candidate."""
    errors: list[tuple[str, str]] = []
    if spec.n_trials > settings.max_trials:
        errors.append(("n_trials", f"{spec.n_trials} is over the limit of {settings.max_trials}"))
    budgets = spec.budget.values()
    if spec.budget.kind == "flops" and max(budgets) > settings.max_budget_flops:
        errors.append(
            (
                "budget.flops",
                f"{max(budgets):g} is over the limit of {settings.max_budget_flops:g}",
            )
        )
    if spec.max_concurrent > settings.max_concurrent_trials:
        errors.append(
            (
                "max_concurrent",
                f"{spec.max_concurrent} is over the limit of {settings.max_concurrent_trials}",
            )
        )
    if spec.seeds > settings.max_seeds:
        errors.append(("seeds", f"{spec.seeds} is over the limit of {settings.max_seeds}"))
    if spec.cluster not in settings.clusters:
        errors.append(
            (
                "cluster",
                f"unknown cluster {spec.cluster!r}; configured: {', '.join(settings.clusters)}",
            )
        )
    if errors:
        raise SpecError(errors)
    candidates = list(enumerate_candidates(spec, settings.max_candidates_enumerated))
    valid = [c for c in candidates if c.arch is not None]
    if not valid:
        reasons = sorted({c.reason for c in candidates})
        raise SpecError([("space", "no valid candidate: " + "; ".join(reasons[:3]))])
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
