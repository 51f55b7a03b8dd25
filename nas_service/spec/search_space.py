"""The spec's search space (`SearchSpace`): depth, one way to set the width
(`d_model`, a `ParamsTarget` or aspect ratios), heads, residual variants, block sizes, and
the architecture fields that are not searched (`ArchDefaults`)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from cost_model import (
    VARIANTS,
)
from cost_model.residuals import BLOCK_SIZED
from nas_service.spec.fields import (
    MAX_ASPECT_RATIO,
    MAX_FF_RATIO,
    IntAxis,
    Text,
    _check_choices,
    _check_names,
    _Strict,
)


class ParamsTarget(_Strict):
    """A fixed parameter count: the width follows from the depth (`cost_model.budget`).

    By default the width is solved once per depth, for the Transformer without depth mixing
    (the standard residual's count), so that every variant of a depth has the same shape and
    the paired comparisons match them; a variant's own mixing parameters (a few vectors per
    sublayer) come on top. `per_variant: true` solves it for each variant's own total, which
    can give two variants of one depth different widths where the target falls between two."""

    params: float = Field(gt=0)
    tolerance: float = Field(default=0.1, gt=0, le=1)
    per_variant: bool = False


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
        return _check_names(value, VARIANTS, "variant", f"one of {', '.join(VARIANTS)}")

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpace:
        widths = [
            self.d_model is not None,
            self.params_target is not None,
            self.aspect_ratio is not None,
        ]
        if sum(widths) != 1:
            raise ValueError("give exactly one of d_model, params_target and aspect_ratio")
        blocked = ", ".join(BLOCK_SIZED)
        if any(v in BLOCK_SIZED for v in self.variants) and self.block_sizes is None:
            raise ValueError(f"block_sizes: needed when variants include {blocked}")
        if self.block_sizes is not None and not any(v in BLOCK_SIZED for v in self.variants):
            raise ValueError(f"block_sizes: only {blocked} has a block size")
        return self
