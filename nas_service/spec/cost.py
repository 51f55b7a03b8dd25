"""The context the cost metrics are priced in (`CostContext`): the workload, a fixed or
searched layout, the hardware preset, a described cluster (`Cluster`) and the step-time
calibration (`StepCalibration`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cost_model import (
    CostInputError,
    Hardware,
    LayoutSpace,
    Parallelism,
    Workload,
    get_hardware,
)
from cost_model.hardware import MAX_DEVICES_PER_NODE
from nas_service.spec.fields import (
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_LAYOUT,
    MAX_MEMORY_CAP_BYTES,
    MAX_MICROBATCHES,
    MAX_SEARCH_LAYOUTS,
    MAX_SEARCH_VIRTUAL,
    Text,
    _refuse,
    _Strict,
)

if TYPE_CHECKING:
    from nas_service.spec.training import Training


#: The fields `layout: auto` searches (and that it refuses to be given), and the fields only
#: `layout: auto` takes.
SEARCHED_LAYOUT_FIELDS = (
    "micro_batch",
    "microbatches",
    "recompute",
    "tensor",
    "pipeline",
    "virtual",
)
AUTO_LAYOUT_FIELDS = ("devices", "global_batch", "memory_cap_bytes", "max_virtual")


class StepCalibration(_Strict):
    """Efficiency factors of the step time on one device kind (`cost_model.calibration`):
    t = compute_factor · compute_s + memory_factor · memory_s + overhead_s. Filled in by the
    service when a job that names `calibrated_step_time_s` is submitted without one (the fit
    of its cluster's measured trials at that moment, so the job's trials stay comparable), or
    given by the user (factors from their own measurements)."""

    compute_factor: float = Field(ge=0, le=1e6)
    memory_factor: float = Field(ge=0, le=1e6)
    overhead_s: float = Field(ge=0, le=3600)
    device_kind: Text = Field(default="given", max_length=200)
    trials: int = Field(default=0, ge=0)  # the measured trials fitted (0: given by the user)

    @model_validator(mode="after")
    def _some_time(self) -> StepCalibration:
        if self.compute_factor == self.memory_factor == self.overhead_s == 0:
            raise ValueError("a calibration of all zeros predicts no time at all")
        return self


#: Ceilings of a described cluster's networks: bytes/s per device and direction (1 PB/s), and
#: seconds per message.
MAX_BANDWIDTH = 1e15
MAX_LATENCY_S = 1.0


class Cluster(_Strict):
    """A user's own cluster of the `hardware` preset's devices (its peaks, memory and
    efficiency fractions): `devices_per_node` devices per node joined by a network of
    `intra_node_bandwidth` bytes/s per device and direction (and `intra_node_latency_s` per
    message), nodes joined by one of `inter_node_bandwidth` (`inter_node_latency_s`);
    optionally `nodes` (the devices a layout may use: nodes × devices_per_node) and the
    achievable fractions of peak compute and memory bandwidth (default: the preset's)."""

    devices_per_node: int = Field(ge=1, le=MAX_DEVICES_PER_NODE)
    intra_node_bandwidth: float = Field(gt=0, le=MAX_BANDWIDTH)
    inter_node_bandwidth: float = Field(gt=0, le=MAX_BANDWIDTH)
    intra_node_latency_s: float = Field(default=0.0, ge=0, le=MAX_LATENCY_S)
    inter_node_latency_s: float = Field(default=0.0, ge=0, le=MAX_LATENCY_S)
    nodes: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    compute_efficiency: float | None = Field(default=None, gt=0, le=1)
    memory_efficiency: float | None = Field(default=None, gt=0, le=1)

    @property
    def devices(self) -> int | None:
        return None if self.nodes is None else self.nodes * self.devices_per_node

    def hardware(self, preset: Hardware) -> Hardware:
        """The preset's device in this cluster."""
        changes: dict[str, Any] = {
            "name": f"{preset.name} (own cluster)",
            "devices_per_node": self.devices_per_node,
            "link_bandwidth": self.intra_node_bandwidth,
            "inter_node_bandwidth": self.inter_node_bandwidth,
            "link_latency_s": self.intra_node_latency_s,
            "inter_node_latency_s": self.inter_node_latency_s,
        }
        for name in ("compute_efficiency", "memory_efficiency"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)
                changes["efficiency_source"] = "given with the cluster"
        return preset.replace(**changes)


class CostContext(_Strict):
    """The workload, layout and hardware the cost metrics are computed for.

    `hardware` names a preset (one GPU of a DGX server, or the CPU); `cluster` describes the
    user's own nodes and networks around that device (`Cluster`). With `layout: auto`, the
    node size must divide `devices` (or `devices` one node), and `devices` must fit the
    cluster's `nodes`; with `layout: fixed`, tensor × pipeline ranks must.

    `layout: fixed` (the default): the layout given by `tensor`, `pipeline`, `virtual`,
    `micro_batch`, `microbatches` and `recompute`. `layout: auto`: each candidate at its
    fastest layout on `devices` devices for a global batch of `global_batch` sequences (default
    8 per device) within `memory_cap_bytes` per device (default: the hardware's memory), as
    `cost_model.search_layout` finds it among the layouts with up to `max_virtual` virtual
    stages; its metrics are priced at that layout, plus `cost_model.LAYOUT_METRICS`
    (`best_step_time_s`, `best_layout_*`). A candidate with no feasible layout is infeasible.
    """

    hardware: Text = Field(default="h100", max_length=64)
    micro_batch: int = Field(default=8, ge=1)
    seq_len: int | None = Field(default=None, ge=1)  # None: the training seq_len
    microbatches: int = Field(default=1, ge=1, le=MAX_MICROBATCHES)
    recompute: Literal["none", "selective", "full"] = "none"
    tensor: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    pipeline: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    virtual: int = Field(default=1, ge=1, le=MAX_LAYOUT)
    decode_context: int | None = Field(default=None, ge=1)
    layout: Literal["fixed", "auto"] = "fixed"
    devices: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    memory_cap_bytes: float | None = Field(default=None, gt=0, le=MAX_MEMORY_CAP_BYTES)
    max_virtual: int = Field(default=4, ge=1, le=MAX_SEARCH_VIRTUAL)
    calibration: StepCalibration | None = None
    cluster: Cluster | None = None

    def hardware_model(self) -> Hardware:
        """The preset, in the user's cluster when one is described."""
        preset = get_hardware(self.hardware)
        return preset if self.cluster is None else self.cluster.hardware(preset)

    @model_validator(mode="after")
    def _fits_the_cluster(self) -> CostContext:
        """The devices a layout uses fit the nodes: a device count the node size divides
        (or one that divides a node), within the cluster's devices when it gives `nodes`."""
        hw = self.hardware_model()
        where = ("cluster", "devices_per_node") if self.cluster else ("devices",)
        total = self.cluster.devices if self.cluster else None
        if self.layout == "auto" and self.devices is not None:
            try:
                hw.check_devices(self.devices, "devices")
            except CostInputError as exc:
                _refuse([(where, exc.reason)])
            if total is not None and self.devices > total:
                _refuse([(("devices",), f"more than the cluster's {total} devices")])
        if self.layout == "fixed" and total is not None:
            if self.tensor > total:
                _refuse([(("tensor",), f"{self.tensor} ranks, more than the cluster's {total}")])
            if self.tensor * self.pipeline > total:
                _refuse([(("pipeline",), f"tensor × pipeline ranks exceed the cluster's {total}")])
        return self

    @model_validator(mode="after")
    def _layout_fields(self, info: ValidationInfo) -> CostContext:
        """`layout: auto` needs `devices` and searches the layout fields (one set to other
        than its default is refused, not ignored); `layout: fixed` takes none of the search's
        fields. The search's size is bounded (`MAX_SEARCH_LAYOUTS`) here, before any candidate
        is priced, but for a stored spec read back (context `stored`: counted at its
        submission). A field at its default counts as not given, so that a stored spec
        (`model_dump`, every field written out) reads back."""
        fields = type(self).model_fields
        given = {f for f in fields if getattr(self, f) != fields[f].default}
        if self.layout == "fixed":
            extra = [f for f in AUTO_LAYOUT_FIELDS if f in given]
            if extra:
                _refuse([((f,), "only with layout: auto") for f in extra])
            return self
        searched = [f for f in SEARCHED_LAYOUT_FIELDS if f in given]
        if searched:
            _refuse([((f,), "layout: auto searches it; leave it out") for f in searched])
        if self.devices is None:
            _refuse([(("devices",), "layout: auto needs the number of devices")])
        if isinstance(info.context, dict) and info.context.get("stored"):
            return self
        try:
            self.layout_space().layouts()
        except CostInputError as exc:
            _refuse([((exc.field,), exc.reason)])
        return self

    def layout_space(self) -> LayoutSpace:
        """The layouts `layout: auto` searches (only with `layout: auto`)."""
        assert self.devices is not None
        batch = self.global_batch or Workload().micro_batch * self.devices
        return LayoutSpace(
            devices=self.devices,
            global_batch=batch,
            max_virtual=self.max_virtual,
            max_layouts=MAX_SEARCH_LAYOUTS,
        )

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
