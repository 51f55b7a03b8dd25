"""Fixed-compute and fixed-parameter budgets: how many tokens a candidate may train on, which
width meets a parameter target at a given depth, and the shape grid of a (compute, params)
pair — the paper's §5.4.1 sweep over d_model/L_b at fixed FLOPs and parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_model._config import ArchConfig, ArchConfigError, CostInputError
from cost_model.flops import training_flops_per_token
from cost_model.params import param_count


def tokens_for_budget(
    cfg: ArchConfig, flops_budget: float, causal: bool = True, recompute: str = "none"
) -> int:
    """Training tokens a candidate gets for `flops_budget`: floor(C / FLOPs per token).

    Budgets use the causal count (Kaplan et al. 2020: 6·N + 6·n_layer·n_ctx·d_attn per token,
    here with the exact terms of `flops.forward_flops_per_token`), so every candidate of a
    search spends the same useful compute. By default (recompute="none") the budget is in
    *model FLOPs*: recomputation does not change what a candidate learns from, so every
    candidate of a search is trained on the same useful compute whatever its layout; this is
    what the service's jobs and the workers use. A budget in *hardware FLOPs* (what the
    devices run) passes the workload's `recompute` mode: it buys fewer tokens under
    recomputation, 3/4 of the blocks' share with full recomputation
    (`flops.training_flops_per_token`)."""
    if not flops_budget > 0:
        raise CostInputError("flops_budget", f"must be positive, got {flops_budget}")
    return int(flops_budget // training_flops_per_token(cfg, causal=causal, recompute=recompute))


def flops_for_tokens(
    cfg: ArchConfig, tokens: int, causal: bool = True, recompute: str = "none"
) -> float:
    """The compute of training `cfg` on `tokens` tokens (the inverse of `tokens_for_budget`):
    model FLOPs by default, hardware FLOPs with a recomputation mode."""
    return float(tokens * training_flops_per_token(cfg, causal=causal, recompute=recompute))


def _at_width(template: ArchConfig, n_layers: int, d_model: int, head_dim: int) -> ArchConfig:
    heads = d_model // head_dim
    kv = None
    if template.n_kv_heads is not None:
        kv = max(1, heads // (template.n_heads // template.kv_heads))
    return template.replace(n_layers=n_layers, d_model=d_model, n_heads=heads, n_kv_heads=kv)


def width_for_params(
    template: ArchConfig,
    n_layers: int,
    target_params: float,
    head_dim: int | None = None,
) -> ArchConfig:
    """The candidate at depth `n_layers` whose width (a multiple of `head_dim`, default the
    template's) brings the total parameter count closest to `target_params`.

    Parameters grow monotonically with d_model, so a bisection over multiples of head_dim
    finds the two widths around the target; the closer one wins. The MLP width follows
    d_model with the template's ratio (a template with a fixed d_ff keeps it)."""
    head_dim = head_dim or template.head_dim
    if n_layers < 1:
        raise CostInputError("n_layers", f"must be positive, got {n_layers}")
    if not target_params > 0:
        raise CostInputError("target_params", f"must be positive, got {target_params}")
    if template.block_size is not None and template.block_size > 2 * n_layers:
        raise ArchConfigError(
            "block_size", f"S = {template.block_size} exceeds 2·n_layers = {2 * n_layers}"
        )

    def params(k: int) -> int:
        return int(param_count(_at_width(template, n_layers, k * head_dim, head_dim)).total)

    lo, hi = 1, 2
    while params(hi) < target_params:
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            raise CostInputError("target_params", f"{target_params:g} is out of reach")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if params(mid) < target_params:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda k: abs(params(k) - target_params))
    return _at_width(template, n_layers, best * head_dim, head_dim)


@dataclass(frozen=True)
class ShapePoint:
    """One shape of a fixed (compute, parameters) grid."""

    config: ArchConfig
    params: int
    tokens: int
    aspect_ratio: float  # d_model / n_layers (per Transformer block, as in the paper)
    params_error: float  # relative distance of params from the target


def shape_grid(
    template: ArchConfig,
    flops_budget: float,
    target_params: float,
    depths: Sequence[int],
    head_dim: int | None = None,
    tolerance: float = 0.1,
) -> list[ShapePoint]:
    """The depth/width grid of a fixed (compute, parameters) pair: for every depth the width
    that meets `target_params`, and the tokens the compute budget then buys. Depths whose
    nearest width misses the target by more than `tolerance` (relative) are left out."""
    if not depths:
        raise CostInputError("depths", "at least one depth is needed")
    points = []
    for n_layers in sorted(set(depths)):
        cfg = width_for_params(template, n_layers, target_params, head_dim)
        total = int(param_count(cfg).total)
        error = abs(total - target_params) / target_params
        if error > tolerance:
            continue
        points.append(
            ShapePoint(
                config=cfg,
                params=total,
                tokens=tokens_for_budget(cfg, flops_budget),
                aspect_ratio=cfg.aspect_ratio,
                params_error=error,
            )
        )
    return points
