"""The cost model for one architecture, workload, parallel layout and hardware."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from cost_model import ArchConfig, CostInputError, Parallelism, Workload, get_hardware, price
from nas_service.api.errors import ApiError, responses
from nas_service.api.routing import SECURED, ApiRoute
from nas_service.api.schemas import CostRead, CostRequest

router = APIRouter(prefix="/v1", tags=["cost"], route_class=ApiRoute, dependencies=SECURED)


def _build(kind: type, data: BaseModel, where: str) -> Any:
    try:
        return kind(**data.model_dump())
    except CostInputError as exc:
        raise ApiError(422, exc.reason, f"{where}.{exc.field}") from None


@router.post("/cost", response_model=CostRead, responses=responses(401, 413, 422))
def cost(body: CostRequest) -> CostRead:
    arch = _build(ArchConfig, body.arch, "arch")
    workload = _build(Workload, body.workload, "workload")
    parallel = _build(Parallelism, body.parallelism, "parallelism")
    try:
        hardware = get_hardware(body.hardware)
    except CostInputError as exc:
        raise ApiError(422, exc.reason, "hardware") from None
    try:
        cost = price(arch, workload, parallel, hardware).as_dict()
    except CostInputError as exc:
        raise ApiError(422, exc.reason, exc.field) from None
    return CostRead(arch=arch.to_dict(), cost=cost)
