"""The names of the residual variants: the one vocabulary that the cost model
(`cost_model.residuals`), the torch model (`workers.model.mixers`), the job spec and the API all
use. Below `cost_model.residuals` and `cost_model._config` (which re-exports it), so that the
variants' implementations and the architecture both read it without importing each other."""

from __future__ import annotations

from typing import Literal, get_args

#: Every residual variant depthscope knows. The last three are the paper's Table 4 ablations of
#: Full AttnRes.
Variant = Literal[
    "baseline",
    "full_attnres",
    "block_attnres",
    "mhc_lite",
    "denseformer",
    "attnres_input_query",
    "attnres_sigmoid",
    "attnres_no_key_norm",
]
VARIANTS: tuple[str, ...] = get_args(Variant)
