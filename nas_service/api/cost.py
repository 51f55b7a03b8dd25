"""The cost model for one architecture, workload, parallel layout and hardware."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter

from cost_model import ArchConfig, CostInputError, Parallelism, Workload, get_hardware, price
from nas_service.api.errors import ApiError
from nas_service.api.schemas import CostRequest

router = APIRouter(prefix="/v1", tags=["cost"])


def _build(kind: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ApiError(422, f"unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
    missing = [f.name for f in dataclasses.fields(kind) if f.default is dataclasses.MISSING]
    absent = [name for name in missing if name not in data]
    if absent:
        raise ApiError(422, "field required", f"{where}.{absent[0]}")
    try:
        return kind(**data)
    except CostInputError as exc:
        raise ApiError(422, exc.reason, f"{where}.{exc.field}") from None


@router.post("/cost")
def cost(body: CostRequest) -> dict[str, Any]:
    arch = _build(ArchConfig, body.arch, "arch")
    workload = _build(Workload, body.workload, "workload")
    parallel = _build(Parallelism, body.parallelism, "parallelism")
    try:
        hardware = get_hardware(body.hardware)
    except CostInputError as exc:
        raise ApiError(422, exc.reason, "hardware") from None
    return {"arch": arch.to_dict(), "cost": price(arch, workload, parallel, hardware).as_dict()}
