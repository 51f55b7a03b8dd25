"""`ArchConfig`: the one description of a candidate architecture.

The model builder (workers), the cost model, the search space and the API schemas all use this
type; nothing re-declares its fields. `ArchGrid` holds the same numeric fields as numpy arrays so
that every cost formula prices a whole grid with the code that prices one candidate.

Terminology (Attention Residuals, Kimi Team 2026): `n_layers` counts Transformer blocks (L_b);
every attention and every MLP is a *sublayer*, so there are L = 2·L_b sublayers. The block size S
of Block AttnRes counts sublayers; N = ceil(L / S) blocks, the last one shorter when S does not
divide L.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from cost_model._variant import VARIANTS as VARIANTS
from cost_model._variant import Variant as Variant
from cost_model.residuals import BLOCK_SIZED, STREAMED, residual_of

# The variants' names (`Variant`, `VARIANTS`) live in `cost_model._variant`, re-exported here.
# Each name's cost terms: `cost_model.residuals.RESIDUALS[name]`, which also derives the variant
# sets (`FULL_ATTNRES_FAMILY`, `ATTNRES_VARIANTS`) from the implementations.

MLP_KINDS: tuple[str, ...] = ("gelu", "swiglu")
NORM_KINDS: tuple[str, ...] = ("rmsnorm", "layernorm")
POSITION_KINDS: tuple[str, ...] = ("rope", "learned")
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

DEFAULT_FF_RATIO: dict[str, float] = {"gelu": 4.0, "swiglu": 8.0 / 3.0}


class CostInputError(ValueError):
    """An invalid input to the cost model. `field` names the offending field, `reason` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # (field, reason), not the joined message: the error crosses processes (Ray) intact
        return (type(self), (self.field, self.reason))


class ArchConfigError(CostInputError):
    """An invalid architecture."""


class _Derived:
    """Derived sizes, written with arithmetic only so they hold for scalars and arrays alike."""

    n_layers: Any
    d_model: Any
    n_heads: Any
    kv_heads: Any
    block_size: Any
    variant: str
    dtype: str
    norm: str
    mlp: str
    positions: str
    bias: bool
    tie_embeddings: bool
    vocab_size: Any
    seq_len: Any
    ffn_dim: Any
    streams: Any

    @property
    def n_sublayers(self) -> Any:
        """L = 2·L_b: every attention and every MLP is a sublayer."""
        return 2 * self.n_layers

    @property
    def head_dim(self) -> Any:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> Any:
        """Width of the K (and of the V) projection: n_kv_heads · head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def n_blocks(self) -> Any:
        """N, the number of depth blocks, as the variant defines it (`Residual.n_blocks`):
        ceil(L/S) for Block AttnRes, L for the Full family, 0 without depth attention."""
        return residual_of(self).n_blocks(self)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class ArchConfig(_Derived):
    """One candidate decoder-only Transformer and its residual wiring.

    Validates itself on construction; an invalid combination raises `ArchConfigError` naming
    the field and the reason.
    """

    n_layers: int  # Transformer blocks L_b (sublayers L = 2·L_b)
    d_model: int
    n_heads: int
    vocab_size: int = 256  # byte-level tokens by default
    seq_len: int = 256
    n_kv_heads: int | None = None  # None: = n_heads (no grouped-query attention)
    d_ff: int | None = None  # None: round(ff_ratio · d_model)
    ff_ratio: float | None = None  # None: 4 for GELU, 8/3 for SwiGLU (equal parameters)
    mlp: str = "gelu"
    norm: str = "rmsnorm"
    positions: str = "rope"
    bias: bool = False
    tie_embeddings: bool = True
    variant: Variant = "baseline"
    block_size: int | None = None  # S in sublayers; Block AttnRes only
    mhc_streams: int | None = None  # n; mHC-lite only (None: 4)
    dtype: str = "float32"  # compute / activation dtype

    def __post_init__(self) -> None:
        for field, value in _fields_of(self):
            _check_scalar_field(field, value)
        self._check_categories()
        self._check_sizes()

    # -- validation -----------------------------------------------------------------------
    def _check_categories(self) -> None:
        choices = {
            "variant": VARIANTS,
            "mlp": MLP_KINDS,
            "norm": NORM_KINDS,
            "positions": POSITION_KINDS,
            "dtype": tuple(DTYPE_BYTES),
        }
        for field, allowed in choices.items():
            value = getattr(self, field)
            if value not in allowed:
                raise ArchConfigError(
                    field, f"unknown value {value!r}; expected one of {', '.join(allowed)}"
                )

    def _check_sizes(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len"):
            if getattr(self, field) < 1:
                raise ArchConfigError(field, f"must be positive, got {getattr(self, field)}")
        for field in ("n_kv_heads", "d_ff", "mhc_streams"):
            value = getattr(self, field)
            if value is not None and value < 1:
                raise ArchConfigError(field, f"must be positive, got {value}")
        if self.ff_ratio is not None:
            if not self.ff_ratio > 0:
                raise ArchConfigError("ff_ratio", f"must be positive, got {self.ff_ratio}")
            if self.d_ff is not None:
                raise ArchConfigError("ff_ratio", "give either d_ff or ff_ratio, not both")
        if self.d_model % self.n_heads:
            raise ArchConfigError(
                "n_heads", f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.n_heads % self.kv_heads:
            raise ArchConfigError(
                "n_kv_heads",
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}",
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ArchConfigError(
                "n_heads", f"RoPE needs an even head dimension, got {self.head_dim}"
            )
        residual = residual_of(self)
        if residual.has_block_size:
            if self.block_size is None:
                raise ArchConfigError("block_size", f"{self.variant} needs a block size S")
            if not 1 <= self.block_size <= self.n_sublayers:
                raise ArchConfigError(
                    "block_size",
                    f"must lie in [1, 2·n_layers = {self.n_sublayers}] sublayers, "
                    f"got {self.block_size}",
                )
        elif self.block_size is not None:
            raise ArchConfigError(
                "block_size",
                f"variant {self.variant!r} has no block size; only {', '.join(BLOCK_SIZED)}",
            )
        if self.mhc_streams is not None and not residual.has_streams:
            raise ArchConfigError(
                "mhc_streams",
                f"variant {self.variant!r} has no streams; only {', '.join(STREAMED)}",
            )
        if residual.has_streams and self.streams > residual.max_streams:
            # n! permutation matrices (see `MHCLite.max_streams`); the paper uses n = 4.
            raise ArchConfigError(
                "mhc_streams",
                f"at most {residual.max_streams} streams (n! permutations), got {self.streams}",
            )

    # -- resolved sizes -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        ratio = DEFAULT_FF_RATIO[self.mlp] if self.ff_ratio is None else self.ff_ratio
        return max(1, round(ratio * self.d_model))

    @property
    def streams(self) -> int:
        """n, the residual streams: 1 unless the variant has streams (`Residual.has_streams`),
        then `mhc_streams` or the variant's default."""
        residual = residual_of(self)
        if not residual.has_streams:
            return 1
        return residual.default_streams if self.mhc_streams is None else self.mhc_streams

    @property
    def aspect_ratio(self) -> float:
        """d_model / L_b, the shape axis of the paper's §5.4.1 (per Transformer block)."""
        return self.d_model / self.n_layers

    def replace(self, **changes: Any) -> ArchConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fields_of(cfg: ArchConfig) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(cfg):
        yield f.name, getattr(cfg, f.name)


_INT_FIELDS = {
    "n_layers",
    "d_model",
    "n_heads",
    "vocab_size",
    "seq_len",
    "n_kv_heads",
    "d_ff",
    "block_size",
    "mhc_streams",
}
_BOOL_FIELDS = {"bias", "tie_embeddings"}


def _check_scalar_field(field: str, value: Any) -> None:
    if value is None:
        return
    if field in _INT_FIELDS and (
        isinstance(value, bool) or not isinstance(value, int | np.integer)
    ):
        raise ArchConfigError(field, f"must be an integer, got {value!r}")
    if field in _BOOL_FIELDS and not isinstance(value, bool):
        raise ArchConfigError(field, f"must be true or false, got {value!r}")
    if field == "ff_ratio" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ArchConfigError(field, f"must be a number, got {value!r}")


@dataclass(frozen=True)
class ArchGrid(_Derived):
    """Many candidates sharing their categorical fields (variant, MLP, norm, …), with numeric
    fields as equal-length int64 arrays. Every cost formula accepts it in place of an
    `ArchConfig` and returns arrays. Build it with `ArchGrid.build`; `valid` marks the points
    that form a valid `ArchConfig`, and `reasons` says why the others do not."""

    n_layers: np.ndarray
    d_model: np.ndarray
    n_heads: np.ndarray
    kv_heads: np.ndarray
    ffn_dim: np.ndarray
    block_size: np.ndarray
    vocab_size: np.ndarray
    seq_len: np.ndarray
    variant: str
    mlp: str
    norm: str
    positions: str
    bias: bool
    tie_embeddings: bool
    dtype: str
    streams: Any
    valid: np.ndarray
    reasons: np.ndarray

    @classmethod
    def build(cls, base: ArchConfig, **axes: Any) -> ArchGrid:
        """Broadcast numeric `axes` (n_layers, d_model, n_heads, n_kv_heads, d_ff, block_size,
        vocab_size, seq_len) against each other; the other fields come from `base`.

        When `d_ff` is not an axis, it follows d_model with the base's ratio (or the base's
        fixed d_ff); when `n_kv_heads` is not, the base's grouping ratio is kept.
        """
        allowed = {"n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "block_size"}
        allowed |= {"vocab_size", "seq_len"}
        unknown = set(axes) - allowed
        if unknown:
            raise ArchConfigError(sorted(unknown)[0], "not a numeric grid axis")
        arrays = [np.asarray(v) for v in axes.values()]
        for name, arr in zip(axes, arrays, strict=True):
            if arr.dtype.kind not in "iu":
                raise ArchConfigError(name, "grid axis must hold integers")
        shaped = dict(zip(axes, np.broadcast_arrays(*arrays), strict=True)) if arrays else {}
        size = int(np.broadcast_shapes(*(a.shape for a in arrays))[0]) if arrays else 1

        def take(name: str, default: int) -> np.ndarray:
            if name in shaped:
                return np.asarray(shaped[name], dtype=np.int64).reshape(-1)
            return np.full(size, default, dtype=np.int64)

        d = take("d_model", base.d_model)
        heads = take("n_heads", base.n_heads)
        group = base.n_heads // base.kv_heads
        kv = take("n_kv_heads", 0) if "n_kv_heads" in shaped else np.maximum(heads // group, 1)
        if "d_ff" in shaped:
            ff = take("d_ff", 0)
        elif base.d_ff is not None:  # a fixed d_ff stays fixed, as in ArchConfig.replace
            ff = np.full(size, base.d_ff, dtype=np.int64)
        else:
            ratio = DEFAULT_FF_RATIO[base.mlp] if base.ff_ratio is None else base.ff_ratio
            ff = np.maximum(np.rint(ratio * d), 1).astype(np.int64)
        block_default = base.block_size if base.block_size is not None else 0
        grid = cls(
            n_layers=take("n_layers", base.n_layers),
            d_model=d,
            n_heads=heads,
            kv_heads=kv,
            ffn_dim=ff,
            block_size=take("block_size", block_default),
            vocab_size=take("vocab_size", base.vocab_size),
            seq_len=take("seq_len", base.seq_len),
            variant=base.variant,
            mlp=base.mlp,
            norm=base.norm,
            positions=base.positions,
            bias=base.bias,
            tie_embeddings=base.tie_embeddings,
            dtype=base.dtype,
            streams=base.streams,
            valid=np.ones(size, dtype=bool),
            reasons=np.full(size, "", dtype=object),
        )
        grid._validate()
        return grid

    def __len__(self) -> int:
        return int(self.n_layers.shape[0])

    @cached_property
    def n_blocks(self) -> Any:
        """N per point, as the variant defines it, computed once per grid: every formula reads
        it (a tenth of a grid's pricing when recomputed each time). The sizes it depends on
        are final once `build` has validated them."""
        return residual_of(self).n_blocks(self)

    def _validate(self) -> None:
        """The numeric checks of `ArchConfig`, as masks. Invalid points keep safe stand-in
        sizes (so formulas do not divide by zero) and are marked in `valid`/`reasons`."""
        checks: list[tuple[np.ndarray, str]] = []
        for name in ("n_layers", "d_model", "n_heads", "kv_heads", "ffn_dim"):
            checks.append((getattr(self, name) < 1, f"{name}: must be positive"))
        for name in ("vocab_size", "seq_len"):
            checks.append((getattr(self, name) < 1, f"{name}: must be positive"))
        safe_heads = np.maximum(self.n_heads, 1)
        safe_kv = np.maximum(self.kv_heads, 1)
        checks.append(
            (self.d_model % safe_heads != 0, "n_heads: d_model is not divisible by n_heads")
        )
        checks.append(
            (self.n_heads % safe_kv != 0, "n_kv_heads: n_heads is not divisible by n_kv_heads")
        )
        if self.positions == "rope":
            checks.append(
                (
                    (self.d_model // safe_heads) % 2 != 0,
                    "n_heads: RoPE needs an even head dimension",
                )
            )
        has_block_size = residual_of(self).has_block_size
        if has_block_size:
            bad = (self.block_size < 1) | (self.block_size > 2 * self.n_layers)
            checks.append((bad, "block_size: must lie in [1, 2·n_layers] sublayers"))
        elif np.any(self.block_size != 0):
            checks.append(
                (self.block_size != 0, f"block_size: variant {self.variant!r} has no block size")
            )
        for mask, reason in checks:
            fresh = mask & self.valid
            self.reasons[fresh] = reason
            self.valid[mask] = False
        # Stand-in sizes keep the arithmetic finite on invalid points; their results are masked.
        for name in (
            "n_layers",
            "d_model",
            "n_heads",
            "kv_heads",
            "ffn_dim",
            "vocab_size",
            "seq_len",
        ):
            arr = getattr(self, name)
            arr[arr < 1] = 1
        if has_block_size:
            self.block_size[(self.block_size < 1)] = 1
