"""The candidates of a space: one candidate's architecture (`build_candidate`), the whole
space enumerated (bounded) and counted (arithmetically), both read from `CandidateSpace`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cost_model import (
    ArchConfig,
    CostInputError,
    width_for_params,
)
from cost_model.residuals import STREAMED
from nas_service.spec.fields import SpecError
from nas_service.spec.model import JobSpec
from nas_service.spec.space import AXES, CandidateSpace


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


def build_candidate(spec: JobSpec, params: dict[str, Any]) -> Candidate:
    """The architecture for one candidate's parameters (`CandidateSpace.candidates`, or
    `from_study` of a trial's); a conditional axis is ignored for variants without it."""
    space = spec.space
    variant = params["variant"]
    n_layers = int(params["n_layers"])
    fields = base_arch(spec) | {"n_layers": n_layers, "variant": variant}
    for d in AXES:
        if d.arch_field and d.name in params and (d.variants is None or variant in d.variants):
            fields[d.name] = int(params[d.name]) if d.kind == "int" else params[d.name]
    if variant in STREAMED:
        fields["mhc_streams"] = space.arch.mhc_streams
    try:
        if space.params_target is not None:
            target = space.params_target
            # the width of the Transformer alone (one shape per depth for every variant), or
            # of this variant's own total (`per_variant`)
            own = fields if target.per_variant else _without_depth_mixing(fields)
            template = ArchConfig(**(own | {"d_model": space.head_dim * 2, "n_heads": 2}))
            arch = width_for_params(template, n_layers, target.params, space.head_dim)
            error = abs(_total_params(arch) - target.params) / target.params
            if error > target.tolerance:
                return Candidate(
                    params, None, f"params_target: nearest width misses by {error:.0%}"
                )
            if not target.per_variant:
                arch = ArchConfig(**(fields | {"d_model": arch.d_model, "n_heads": arch.n_heads}))
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


def _without_depth_mixing(fields: dict[str, Any]) -> dict[str, Any]:
    """The architecture's fields with the standard residual as its wiring (and none of the
    fields only a depth-mixing variant has)."""
    return fields | {"variant": "baseline", "block_size": None, "mhc_streams": None}


def _total_params(arch: ArchConfig) -> int:
    from cost_model import param_count

    return int(param_count(arch).total)


def enumerate_candidates(spec: JobSpec, limit: int | None = None) -> Iterator[Candidate]:
    """Every point of the (discrete) space (`CandidateSpace.candidates`); a conditional axis
    such as `block_size` only varies for its variants.

    With `limit`, a space of more candidates is refused (`SpecError` on "space") before
    anything is expanded; without one, call it on a spec `check_job` accepted."""
    space = CandidateSpace(spec)
    if limit is not None and space.size() > limit:
        raise SpecError([("space", f"more than {limit} candidates; narrow the space")])
    for params in space.candidates():
        yield build_candidate(spec, params)


def space_size(spec: JobSpec) -> int:
    """The number of candidates, counted arithmetically (nothing is expanded)."""
    return CandidateSpace(spec).size()


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
