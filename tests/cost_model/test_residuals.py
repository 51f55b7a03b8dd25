"""The residual variant is the unit: the registry covers exactly the `Variant` names, every
implementation fulfils the `Residual` contract (all of it, arithmetic only: a grid is priced as
each of its points), and no module outside `cost_model/residuals/` branches on variant names."""

from __future__ import annotations

import ast
import gc
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cost_model
from cost_model import ATTNRES_VARIANTS, FULL_ATTNRES_FAMILY, VARIANTS, ArchConfig, ArchGrid
from cost_model.residuals import RESIDUALS, STREAMED, Residual, residual_of

PACKAGE = Path(cost_model.__file__).parent


def test_registry_covers_exactly_the_variant_literal() -> None:
    assert sorted(RESIDUALS) == sorted(VARIANTS)
    assert len(set(VARIANTS)) == len(VARIANTS)
    for name, residual in RESIDUALS.items():
        assert residual.name == name


def test_variant_sets_are_derived_from_the_implementations() -> None:
    assert (
        frozenset({"full_attnres", "attnres_input_query", "attnres_sigmoid", "attnres_no_key_norm"})
        == FULL_ATTNRES_FAMILY
    )
    assert FULL_ATTNRES_FAMILY | {"block_attnres"} == ATTNRES_VARIANTS
    assert {n for n, r in RESIDUALS.items() if r.has_block_size} == {"block_attnres"}
    assert {n for n, r in RESIDUALS.items() if r.has_streams} == {"mhc_lite"}


def _contract() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(Residual).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_residual_implements_the_protocol(variant: str) -> None:
    residual = RESIDUALS[variant]
    assert isinstance(residual, Residual)
    assert not inspect.isabstract(type(residual))
    contract = _contract()
    assert {"mixing_flops", "mixing_params", "pipeline_payload", "sublayer_io"} <= set(contract)
    for name, signature in contract.items():
        method = getattr(type(residual), name)
        own = inspect.signature(method)
        assert list(own.parameters) == list(signature.parameters), (variant, name)
    if not residual.has_streams:
        assert residual.default_streams == residual.max_streams == 1


def make(variant: str, **kw: Any) -> ArchConfig:
    base: dict[str, Any] = {"n_layers": 5, "d_model": 64, "n_heads": 4, "variant": variant}
    if RESIDUALS[variant].has_block_size:
        base["block_size"] = 3
    base.update(kw)
    return ArchConfig(**base)


# calls of every method of the contract with its non-`cfg` arguments
CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("n_blocks", ()),
    ("attended_sources_total", ()),
    ("aggregation_sources", ()),
    ("live_sources", ()),
    ("cached_sources", ()),
    ("sources_per_stage", (4,)),
    ("mixing_params", ()),
    ("aggregation_params", ()),
    ("mixing_flops", ()),
    ("mixing_activation_bytes", (3 * 128, 2, "none")),
    ("mixing_activation_bytes", (128, 4, "selective")),
    ("mixing_activation_bytes", (128, 4, "full")),
    ("sublayer_io", ("two_phase", None)),
    ("sublayer_io", ("two_phase", 3)),
    ("sublayer_io", ("naive", None)),
    ("pipeline_payload", (6,)),
    ("boundary_sources", (3,)),
]


def test_calls_cover_the_contract() -> None:
    assert {name for name, _ in CALLS} == set(_contract())


def _as_arrays(value: Any) -> list[np.ndarray]:
    parts = value if isinstance(value, tuple) else (value,)
    return [np.asarray(p, dtype=np.float64) for p in parts]


@pytest.mark.parametrize(
    ("variant", "streams"),
    [(v, None) for v in VARIANTS] + [(v, n) for v in VARIANTS for n in (2, 3) if v in STREAMED],
)
def test_a_grid_is_priced_as_each_of_its_points(variant: str, streams: int | None) -> None:
    """Every method on an `ArchGrid` equals the method on each point's `ArchConfig`: the
    formulas are arithmetic only (a branch on a numeric array would raise here)."""
    residual = RESIDUALS[variant]
    depths, widths = np.array([1, 2, 5, 8, 13]), np.array([32, 64, 96, 128, 64])
    heads = np.array([2, 4, 4, 8, 2])
    axes: dict[str, np.ndarray] = {"n_layers": depths, "d_model": widths, "n_heads": heads}
    if residual.has_block_size:
        axes["block_size"] = np.array([1, 3, 4, 16, 26])
    base = make(variant, mhc_streams=streams)
    grid = ArchGrid.build(base, **axes)
    assert grid.valid.all(), grid.reasons
    points = [
        base.replace(**{name: int(values[i]) for name, values in axes.items()})
        for i in range(len(grid))
    ]
    for name, args in CALLS:
        on_grid = _as_arrays(getattr(residual, name)(grid, *args))
        for i, cfg in enumerate(points):
            on_point = _as_arrays(getattr(residual, name)(cfg, *args))
            assert len(on_point) == len(on_grid)
            for got, want in zip(on_grid, on_point, strict=True):
                got_i = np.broadcast_to(got, (len(grid),))[i]
                assert got_i == pytest.approx(float(want), rel=1e-12), (name, args, cfg)


def test_residual_of_reads_the_variant() -> None:
    for variant in VARIANTS:
        cfg = make(variant)
        assert residual_of(cfg) is RESIDUALS[variant]
        assert cfg.n_blocks == RESIDUALS[variant].n_blocks(cfg)


# -- no variant branches outside cost_model/residuals/ ---------------------------------------


#: sets of variant names: a membership test against one is a branch on names
NAME_SETS = {"ATTNRES_VARIANTS", "BLOCK_SIZED", "FULL_ATTNRES_FAMILY", "STREAMED"}


def _is_variant(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "variant"
    return isinstance(node, ast.Name) and (node.id == "variant" or node.id in aliases)


def variant_branches(source: str) -> list[str]:
    """Where `source` compares a `.variant` or a name bound to one (==, !=, in, is; or matches
    on it), tests membership in a set of variant names, or names a variant with a string
    literal — except the `Variant` Literal itself and a field's default. A module outside
    `cost_model/residuals/` should ask `residual_of(cfg)` instead."""
    tree = ast.parse(source)
    aliases = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_variant(node.value, set())
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "Variant" for t in node.targets)
        ) or (isinstance(node, ast.AnnAssign) and _is_variant(node.target, set())):
            exempt.update(id(n) for n in ast.walk(node))
    names = set(VARIANTS)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(_is_variant(o, aliases) for o in operands):
            found.append(f"line {line}: compares the variant")
        elif any(isinstance(o, ast.Name) and o.id in NAME_SETS for o in operands):
            found.append(f"line {line}: tests membership in a set of variant names")
        elif isinstance(node, ast.Match) and _is_variant(node.subject, aliases):
            found.append(f"line {line}: matches on the variant")
        elif isinstance(node, ast.Constant) and node.value in names and id(node) not in exempt:
            found.append(f"line {line}: names the variant {node.value!r}")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        'if cfg.variant == "mhc_lite":\n    pass',
        'if "block_attnres" != cfg.variant:\n    pass',
        "if cfg.variant in FULL_ATTNRES_FAMILY:\n    pass",
        "v = cfg.variant\nif v not in ATTNRES_VARIANTS:\n    pass",
        "kind = grid.variant\nflag = kind is not None",
        "if name in BLOCK_SIZED:\n    pass",
        'x = 2 if self.variant == "denseformer" else 1',
        'v = cfg.variant\nif v == "baseline":\n    pass',
        'x = {"block_attnres": 1}.get(cfg.variant, 0)',
        'match cfg.variant:\n    case "baseline":\n        pass',
        'if cfg.variant in ("full_attnres", "attnres_sigmoid"):\n    pass',
    ],
)
def test_the_check_catches_variant_branches(snippet: str) -> None:
    assert variant_branches(snippet)


def test_the_check_lets_the_registry_speak() -> None:
    ok = (
        "residual = residual_of(cfg)\n"
        "if residual.has_block_size:\n    pass\n"
        "x = residual.mixing_flops(cfg)\n"
        'Variant = Literal["baseline", "full_attnres"]\n'
        'class A:\n    variant: Variant = "baseline"\n'
        '"""A docstring naming block_attnres in passing."""\n'
    )
    assert variant_branches(ok) == []


def test_no_module_outside_residuals_branches_on_variant_names() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "residuals" not in p.relative_to(PACKAGE).parts]
    assert {p.name for p in modules} >= {"_config.py", "flops.py", "memory.py", "comm.py"}
    offences = {
        str(p.relative_to(PACKAGE)): found
        for p in modules
        if (found := variant_branches(p.read_text(encoding="utf-8")))
    }
    assert offences == {}, "ask cost_model.residuals.residual_of(cfg) instead"


def test_discovery_refuses_a_residual_without_its_own_name_or_a_shared_one() -> None:
    from cost_model.residuals import FullAttnRes, _discover

    class Unnamed(FullAttnRes):
        pass

    class Twin(FullAttnRes):
        name = "full_attnres"

    try:
        for cls, fragment in ((Unnamed, "without its own name"), (Twin, "two residuals")):
            cls.__module__ = "cost_model.residuals.elsewhere"  # as if defined in the package
            with pytest.raises(TypeError, match=fragment):
                _discover()
            cls.__module__ = __name__  # outside the package: ignored again
        assert sorted(_discover()) == sorted(VARIANTS)
    finally:
        del Unnamed, Twin
        gc.collect()
