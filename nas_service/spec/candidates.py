"""The candidates of a space: its axes, one candidate's architecture, the whole space
enumerated (bounded) and counted (arithmetically)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cost_model import (
    ArchConfig,
    CostInputError,
    width_for_params,
)
from nas_service.spec.model import (
    JobSpec,
    SpecError,
    axis_count,
    axis_values,
)


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
