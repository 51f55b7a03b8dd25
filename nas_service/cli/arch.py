"""The architecture flags of `depthscope cost` and `depthscope train`, made from the fields
of `cost_model.ArchConfig` (one flag per field: its type, its default and a line of help),
and `--arch FILE.yaml`, a YAML mapping of the same fields.

A value comes from the flag, else from the file, else from the dataclass's default; a field
without a default (`n_layers`, `d_model`, `n_heads`) must come from one of the first two.
Every value is checked against the field's type here and by `ArchConfig` itself, and every
refusal is an `ArchConfigError` naming the field. The cost model (numpy) is imported when the
flags are built, not with this module: `depthscope db` runs where only the database layer is
installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

#: One line of help per field (a field missing here gets its name as help).
HELP: dict[str, str] = {
    "n_layers": "Transformer blocks L_b (sublayers L = 2·L_b)",
    "d_model": "model width",
    "n_heads": "attention heads",
    "vocab_size": "vocabulary size",
    "seq_len": "sequence length in tokens",
    "n_kv_heads": "key/value heads (grouped-query attention; default: n_heads)",
    "d_ff": "MLP width (default: ff_ratio · d_model)",
    "ff_ratio": "MLP width over d_model (default: 4 for gelu, 8/3 for swiglu)",
    "mlp": "MLP kind",
    "norm": "normalisation",
    "positions": "position encoding",
    "bias": "biases in linear layers and norms",
    "tie_embeddings": "the LM head shares the embedding matrix (--untied: a head of its own)",
    "variant": "residual variant",
    "block_size": "S in sublayers (block_attnres); a Transformer block is two sublayers, so a "
    "depth block every 12 Transformer layers (K3's and Megatron's count) is 24",
    "mhc_streams": "n streams (mhc_lite; default: 4)",
    "dtype": "compute and activation dtype",
}
#: Older spellings kept: flag → (field, the value it sets).
ALIASES: dict[str, tuple[str, Any]] = {"--untied": ("tie_embeddings", False)}


@dataclasses.dataclass(frozen=True)
class ArchField:
    """One `ArchConfig` field as the command line sees it."""

    name: str
    kind: type  # int, float, str or bool
    optional: bool  # None is a value (the field's default means "derived")
    choices: tuple[str, ...]  # a Literal's values (checked by ArchConfig, shown in help)
    default: Any  # dataclasses.MISSING when the field is required
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def _field(f: dataclasses.Field[Any], hint: Any) -> ArchField:
    """The command-line form of one field (TypeError for a type without one)."""
    optional = False
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        if len(args) != 1:
            raise TypeError(f"ArchConfig.{f.name}: no command-line form for {hint}")
        hint = args[0]
    choices: tuple[str, ...] = ()
    if get_origin(hint) is Literal:
        choices = tuple(str(v) for v in get_args(hint))
        hint = str
    if hint not in (int, float, str, bool):
        raise TypeError(f"ArchConfig.{f.name}: no command-line form for {hint}")
    default = f.default
    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    return ArchField(f.name, hint, optional, choices, default, HELP.get(f.name, f.name))


def arch_fields() -> list[ArchField]:
    """Every field of `ArchConfig`, in its order."""
    from cost_model import ArchConfig

    hints = get_type_hints(ArchConfig)
    return [_field(f, hints[f.name]) for f in dataclasses.fields(ArchConfig)]


def _finite_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def add_arch_args(p: argparse.ArgumentParser, many_variants: bool) -> None:
    """One flag per `ArchConfig` field, and `--arch FILE`. Flags left out are absent from
    the namespace (`argparse.SUPPRESS`), so that `arch_values` knows what was given."""
    group = p.add_argument_group(
        "architecture", "the fields of cost_model.ArchConfig; a flag overrides --arch FILE"
    )
    group.add_argument(
        "--arch",
        metavar="FILE.yaml",
        help="a YAML mapping of architecture fields (n_layers: 8, variant: block_attnres, …)",
    )
    for f in arch_fields():
        text = f.help
        if f.name == "variant" and many_variants:
            text += ", or a comma-separated list to compare side by side"
        if f.choices:
            text += f" ({' | '.join(f.choices)})"
        if f.required:
            text += " (required, here or in --arch)"
        elif f.default is not None:
            text += f" (default: {f.default})"
        if f.kind is bool:
            group.add_argument(
                f.flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
            )
            continue
        kind: Any = _finite_arg if f.kind is float else f.kind
        metavar = f.name.upper() if not f.choices else "NAME"
        group.add_argument(f.flag, type=kind, default=argparse.SUPPRESS, metavar=metavar, help=text)
    for flag, (name, value) in ALIASES.items():
        group.add_argument(
            flag,
            dest=name,
            action="store_const",
            const=value,
            default=argparse.SUPPRESS,
            help=f"the same as --{'no-' if value is False else ''}{name.replace('_', '-')}",
        )


def _check_value(f: ArchField, value: Any, where: str) -> Any:
    """A value from the file, of the field's type (ints for floats are accepted)."""
    from cost_model import ArchConfigError

    if value is None and f.optional:
        return None
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[f.kind]
    if not ok:
        what = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        empty = " or null" if f.optional else ""
        raise ArchConfigError(f.name, f"must be {what[f.kind]}{empty}, got {value!r}{where}")
    if f.kind is float:
        if not math.isfinite(value):
            raise ArchConfigError(f.name, f"must be a finite number, got {value!r}{where}")
        return float(value)
    return value


def load_arch_file(path: str) -> dict[str, Any]:
    """The fields of an architecture file: a YAML mapping read by the spec package's loader
    (its size cap, no anchors or aliases), every key an `ArchConfig` field and every value
    of its type. Raises `ArchConfigError` naming the field (field "arch" for the file)."""
    from cost_model import ArchConfigError
    from nas_service.spec import SpecError, read_yaml_mapping

    try:
        data = read_yaml_mapping(path, field="arch")
    except SpecError as exc:
        raise ArchConfigError(exc.field, exc.reason) from None
    known = {f.name: f for f in arch_fields()}
    where = f" (in {path!r})"
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = known.get(key) if isinstance(key, str) else None
        if f is None:
            raise ArchConfigError(
                ascii(key) if not isinstance(key, str) or not key.isprintable() else key,
                f"not an architecture field{where}; expected one of {', '.join(known)}",
            )
        out[key] = _check_value(f, value, where)
    return out


def arch_values(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture's fields: the flags given, over the file's, over the defaults.
    Raises `ArchConfigError` for a bad file or a required field given nowhere."""
    from cost_model import ArchConfigError

    fields = arch_fields()
    values = {f.name: f.default for f in fields if not f.required}
    if getattr(args, "arch", None):
        values |= load_arch_file(args.arch)
    values |= {f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)}
    for f in fields:
        if f.name not in values:
            raise ArchConfigError(f.name, f"required: give {f.flag} or set it in --arch FILE")
    return values


#: The cluster flags of `depthscope cost`: flag → (the `cost_model.Hardware` field it sets,
#: its type, help). A flag left out keeps the preset's figure.
CLUSTER_FLAGS: dict[str, tuple[str, type, str]] = {
    "--devices-per-node": ("devices_per_node", int, "devices per node (DGX presets: 8)"),
    "--intra-node-bandwidth": (
        "link_bandwidth",
        float,
        "bytes/s per device and direction inside a node (DGX H100: 450e9)",
    ),
    "--inter-node-bandwidth": (
        "inter_node_bandwidth",
        float,
        "bytes/s per device and direction between nodes (DGX H100: 50e9)",
    ),
    "--intra-node-latency": ("link_latency_s", float, "seconds per message inside a node"),
    "--inter-node-latency": ("inter_node_latency_s", float, "seconds per message between nodes"),
    "--compute-efficiency": (
        "compute_efficiency",
        float,
        "achievable fraction of the peak FLOP/s (default: the preset's)",
    ),
    "--memory-efficiency": (
        "memory_efficiency",
        float,
        "achievable fraction of the memory bandwidth (default: the preset's)",
    ),
}


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The flags describing the user's own cluster around the `--hardware` preset's device."""
    group = p.add_argument_group(
        "cluster",
        "your own nodes and networks around the --hardware device (default: the preset's: "
        "one GPU of a DGX server, 8 per node, NVLink inside, InfiniBand between)",
    )
    for flag, (_, kind, text) in CLUSTER_FLAGS.items():
        parse: Any = _finite_arg if kind is float else int
        group.add_argument(flag, type=parse, default=None, metavar=kind.__name__.upper(), help=text)
    group.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="nodes in the cluster: a layout may use at most nodes × devices per node",
    )
    group.add_argument(
        "--peak-only",
        action="store_true",
        help="the datasheet roofline: efficiency fractions 1 and no latency",
    )


def cluster_hardware(args: argparse.Namespace) -> Any:
    """The `--hardware` preset with the cluster flags given (`cost_model.Hardware`); raises
    `CostInputError` naming the flag of a bad value."""
    from cost_model import CostInputError, get_hardware

    hw = get_hardware(args.hardware)
    changes = {
        field: getattr(args, flag[2:].replace("-", "_"))
        for flag, (field, _, _) in CLUSTER_FLAGS.items()
        if getattr(args, flag[2:].replace("-", "_"), None) is not None
    }
    if changes:
        changes["name"] = f"{hw.name} (own cluster)"
        if {"compute_efficiency", "memory_efficiency"} & changes.keys():
            changes["efficiency_source"] = "given on the command line"
        try:
            hw = hw.replace(**changes)
        except CostInputError as exc:
            flag = next((f for f, (name, _, _) in CLUSTER_FLAGS.items() if name == exc.field), None)
            raise CostInputError(flag or exc.field, exc.reason) from None
    if getattr(args, "peak_only", False):
        hw = hw.peak_only()
    nodes = getattr(args, "nodes", None)
    if nodes is not None:
        if nodes < 1:
            raise CostInputError("--nodes", f"must be positive, got {nodes}")
        if hw.devices_per_node is None:
            raise CostInputError("--nodes", f"{hw.name} has no nodes: give --devices-per-node")
    return hw
