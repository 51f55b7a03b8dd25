"""depthscope's analytic cost model: pure functions of an architecture, a workload, a
parallel layout and a hardware preset, returning typed results in explicit units.

Standard library and numpy only: no torch, ray, database or web imports (enforced by a test).
"""

from cost_model._config import (
    DTYPE_BYTES,
    MLP_KINDS,
    NORM_KINDS,
    POSITION_KINDS,
    VARIANTS,
    ArchConfig,
    ArchConfigError,
    ArchGrid,
    CostInputError,
    Variant,
)
from cost_model._workload import RECOMPUTE_MODES, Parallelism, Workload
from cost_model.budget import (
    ShapePoint,
    flops_for_tokens,
    shape_grid,
    tokens_for_budget,
    width_for_params,
)
from cost_model.comm import PipelineComm, pipeline_comm
from cost_model.flops import (
    FlopsBreakdown,
    decode_flops_per_token,
    forward_flops_per_token,
    prefill_flops,
    training_flops_per_token,
)
from cost_model.hardware import PRESETS, Hardware
from cost_model.io import ResidualIO, residual_io
from cost_model.layout import (
    LAYOUT_METRICS,
    RECOMPUTE_CODES,
    Layout,
    LayoutSearch,
    LayoutSpace,
    PricedLayout,
    search_layout,
)
from cost_model.layout_grid import GridLayouts, best_layouts, search_layout_grid
from cost_model.machine import get_hardware
from cost_model.memory import (
    ActivationSettings,
    InferenceMemory,
    TrainingMemory,
    inference_memory,
    training_memory,
)
from cost_model.params import ParamCount, param_count
from cost_model.report import METRICS, CostReport, GridPrices, price, price_grid, price_many
from cost_model.residuals import ATTNRES_VARIANTS, FULL_ATTNRES_FAMILY

__all__ = [
    "ATTNRES_VARIANTS",
    "DTYPE_BYTES",
    "FULL_ATTNRES_FAMILY",
    "LAYOUT_METRICS",
    "METRICS",
    "MLP_KINDS",
    "NORM_KINDS",
    "POSITION_KINDS",
    "PRESETS",
    "RECOMPUTE_CODES",
    "RECOMPUTE_MODES",
    "VARIANTS",
    "ActivationSettings",
    "ArchConfig",
    "ArchConfigError",
    "ArchGrid",
    "CostInputError",
    "CostReport",
    "FlopsBreakdown",
    "GridLayouts",
    "GridPrices",
    "Hardware",
    "InferenceMemory",
    "Layout",
    "LayoutSearch",
    "LayoutSpace",
    "Parallelism",
    "ParamCount",
    "PipelineComm",
    "PricedLayout",
    "ResidualIO",
    "ShapePoint",
    "TrainingMemory",
    "Variant",
    "Workload",
    "best_layouts",
    "decode_flops_per_token",
    "flops_for_tokens",
    "forward_flops_per_token",
    "get_hardware",
    "inference_memory",
    "param_count",
    "pipeline_comm",
    "prefill_flops",
    "price",
    "price_grid",
    "price_many",
    "residual_io",
    "search_layout",
    "search_layout_grid",
    "shape_grid",
    "tokens_for_budget",
    "training_flops_per_token",
    "training_memory",
    "width_for_params",
]
