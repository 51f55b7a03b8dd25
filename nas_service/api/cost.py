"""The cost model for one architecture, workload, parallel layout and hardware; with
`layout: auto`, at the fastest layout on a number of devices (`cost_model.search_layout`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from cost_model import (
    ArchConfig,
    CostInputError,
    Hardware,
    LayoutSpace,
    Parallelism,
    Workload,
    get_hardware,
    price,
    search_layout,
)
from nas_service.api.errors import ApiError, responses
from nas_service.api.routing import SECURED, ApiRoute
from nas_service.api.schemas import CostRead, CostRequest
from nas_service.spec.cost import AUTO_LAYOUT_FIELDS
from nas_service.spec.fields import MAX_SEARCH_LAYOUTS

router = APIRouter(prefix="/v1", tags=["cost"], route_class=ApiRoute, dependencies=SECURED)

#: The workload fields `layout: auto` searches (and refuses to be given).
_SEARCHED_WORKLOAD = ("micro_batch", "microbatches", "recompute")
#: The request's `workload` fields, which a refusal while pricing names under `workload.`.
_WORKLOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(Workload))


def _build(kind: type, data: BaseModel, where: str) -> Any:
    try:
        return kind(**data.model_dump())
    except CostInputError as exc:
        raise ApiError(422, exc.reason, f"{where}.{exc.field}") from None


def _refused(exc: CostInputError) -> ApiError:
    """A refusal of the cost model while pricing, as a 422 naming the request's field: a
    workload field under `workload.` (a training sequence, prefill or decode context longer
    than learned positions), any other (the layout search's) as the model names it."""
    field = f"workload.{exc.field}" if exc.field in _WORKLOAD_FIELDS else exc.field
    return ApiError(422, exc.reason, field)


def _changed(model: BaseModel, name: str) -> bool:
    """Whether a field holds other than its default."""
    return bool(getattr(model, name) != type(model).model_fields[name].default)


def _check_layout_fields(body: CostRequest) -> None:
    """`layout: fixed` takes none of the search's fields; `layout: auto` needs `devices` and
    takes no `parallelism` nor the workload fields it searches (a field set to other than its
    default is never ignored silently)."""
    if body.layout == "fixed":
        for name in ("feasible_layouts", *AUTO_LAYOUT_FIELDS):
            if _changed(body, name):
                raise ApiError(422, "only with layout: auto", name)
        return
    parallelism: BaseModel = body.parallelism
    if any(_changed(parallelism, name) for name in type(parallelism).model_fields):
        raise ApiError(
            422, "layout: auto searches the parallel layout; leave it out", "parallelism"
        )
    workload: BaseModel = body.workload
    for name in _SEARCHED_WORKLOAD:
        if _changed(workload, name):
            raise ApiError(422, "layout: auto searches it; leave it out", f"workload.{name}")
    if body.devices is None:
        raise ApiError(422, "layout: auto needs the number of devices", "devices")


def _auto(arch: ArchConfig, workload: Workload, body: CostRequest, hw: Hardware) -> CostRead:
    """The report at the fastest feasible layout, and the search; 422 when none is feasible,
    naming `devices` (no layout divides the architecture) or `memory_cap_bytes` (none fits)."""
    assert body.devices is not None
    try:
        hw.check_devices(body.devices, "devices")
        space = LayoutSpace(
            devices=body.devices,
            global_batch=body.global_batch or Workload().micro_batch * body.devices,
            max_virtual=body.max_virtual,
            max_layouts=MAX_SEARCH_LAYOUTS,
        )
        found = search_layout(
            arch, space, workload, hw, body.memory_cap_bytes, keep=body.feasible_layouts
        )
    except CostInputError as exc:
        raise _refused(exc) from None
    if found.best is None:
        field = "memory_cap_bytes" if found.divisible else "devices"
        raise ApiError(422, found.reason, field)
    best = found.best.layout
    try:
        report = price(arch, best.workload(workload), best.parallelism(), hw)
    except CostInputError as exc:
        raise _refused(exc) from None
    return CostRead(arch=arch.to_dict(), cost=report.as_dict(), layout=found.as_dict())


@router.post("/cost", response_model=CostRead, responses=responses(401, 413, 422))
def cost(body: CostRequest) -> CostRead:
    _check_layout_fields(body)
    arch = _build(ArchConfig, body.arch, "arch")
    workload = _build(Workload, body.workload, "workload")
    try:
        hardware = get_hardware(body.hardware)
    except CostInputError as exc:
        raise ApiError(422, exc.reason, "hardware") from None
    if body.layout == "auto":
        return _auto(arch, workload, body, hardware)
    parallel = _build(Parallelism, body.parallelism, "parallelism")
    try:
        cost = price(arch, workload, parallel, hardware).as_dict()
    except CostInputError as exc:
        raise _refused(exc) from None
    return CostRead(arch=arch.to_dict(), cost=cost)
