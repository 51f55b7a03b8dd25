"""The conformance suite every residual variant runs (the fast path, as trained): parameters,
FLOPs (against `FlopCounterMode`) and saved activations (against `saved_tensors_hooks`) equal
the cost model; cached decoding equals the training forward; the model is causal, trainable
and deterministic."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cost_model import (
    ATTNRES_VARIANTS,
    VARIANTS,
    ArchConfig,
    Workload,
    forward_flops_per_token,
    param_count,
    training_memory,
)
from cost_model.depth import aggregation_sources, attended_sources_total
from workers.model import build_model
from workers.model import layers as layers_module

from .support import SHAPES, make, perturb


# -- cost-model agreement ----------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_param_count_equals_cost_model(variant: str, shape: int) -> None:
    cfg = make(variant, **SHAPES[shape])
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg).total


def counted_flops(cfg: ArchConfig, backward: bool) -> int:
    model = build_model(cfg, attn_impl="math")
    perturb(model)
    idx = torch.randint(
        0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1)
    )
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        if backward:
            assert loss is not None
            loss.backward()
    return int(counter.get_total_flops())


def counter_visible_mixing(cfg: ArchConfig) -> tuple[float, float]:
    """The depth-mixing FLOPs per token a FLOP counter sees, (forward, backward).

    The counter counts matrix products only. Full and Block AttnRes with static queries run on
    a `DepthStack` (workers/model/depth_stack.py): for a source on the stack every term is a
    product — forward its logits and its share of the weighted sum (the analytic 4·d per
    (source, use) pair), backward the weight gradient, the Σα·g term, the query term and the
    query gradient (8·d) — except that a weighted sum over a single stack source is an
    element-wise product: the uses that see one stack source (Full's first sublayer, Block's
    first block) and the stack source with one use (the last one, seen by the aggregation only).
    Block's running partial, a source outside the stack, gets its logit forward and its query
    gradient backward as products (2·d each); its weighted add and value gradient are
    element-wise. With the input-dependent query (per-use `depth_attend`) the d×d projections
    (3×), the aggregation's static query and, backward, the weight gradients' dot products are
    products. DenseFormer's weighted average is a product forward and for the weight gradient.
    mHC-lite is all products except the outer products H_post ⊗ f (forward) and H_pre ⊗ dh
    (backward), which are element-wise, and its constant permutation matrices get no
    gradient."""
    mixing = forward_flops_per_token(cfg).depth_mixing_flops
    d, sub = cfg.d_model, cfg.n_sublayers
    if cfg.variant == "attnres_input_query":
        proj = 2 * d * d * sub
        agg = 2 * d * (sub + 1)
        dots = 2 * d * (attended_sources_total(cfg) + aggregation_sources(cfg))
        return proj + agg, 2 * proj + agg + dots
    if cfg.variant in ATTNRES_VARIANTS:
        block = cfg.variant == "block_attnres"
        partial_uses = sub - cfg.n_blocks if block else 0
        one_source_uses = min(cfg.block_size, sub) if block else 1
        one_use_sources = 1
        forward = mixing - 2 * d * (partial_uses + one_source_uses)
        return forward, 2 * mixing - 6 * d * partial_uses - 2 * d * one_use_sources
    if cfg.variant == "denseformer":
        return mixing, mixing
    if cfg.variant == "mhc_lite":
        perm_mix = 2 * math.factorial(cfg.streams) * cfg.streams**2 * sub
        outer = 2 * cfg.streams * d * sub
        return mixing - outer, 2 * mixing - perm_mix - outer
    return 0, 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_flops_equal_torch_flop_counter(variant: str) -> None:
    """Exact agreement, term by term (tolerance: none).

    Both sides count matrix products only (2 FLOPs per multiply-add). The model runs with
    attention written as matmuls (`attn_impl="math"`, a dense s×s product, as the analytic
    count with attended = seq_len assumes), because the counter has no formula for the CPU SDPA
    kernel. Every weight matmul costs 1× forward and 2× backward; the depth mixing is compared
    through `counter_visible_mixing`, which says which of its terms are products."""
    cfg = make(variant, n_layers=3)
    tokens = 2 * cfg.seq_len
    analytic = forward_flops_per_token(cfg)
    matmul_forward = analytic.total_flops - analytic.depth_mixing_flops
    mix_fwd, mix_bwd = counter_visible_mixing(cfg)
    assert counted_flops(cfg, backward=False) == tokens * (matmul_forward + mix_fwd)
    expected = 3 * matmul_forward + mix_fwd + mix_bwd
    assert counted_flops(cfg, backward=True) == tokens * expected


def saved_activation_bytes(model: torch.nn.Module, batch: int, seq_len: int, vocab: int) -> int:
    """Bytes of distinct storages the autograd graph saves for one forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    gen = torch.Generator().manual_seed(batch)
    idx = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, targets)
    return sum(seen.values())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_activation_bytes_equal_saved_tensors(variant: str, shape: int) -> None:
    """The analytic activation memory (fp32, no dropout, fused attention, norm extras) against
    what the autograd graph saves, deduplicated by storage. Tolerance 2% (it agrees exactly on
    torch 2.13 CPU). Parameters are also saved (by the matmuls) but do not grow with the batch:
    the measurement is the difference between batch 4 and batch 2, i.e. two sequences."""
    cfg = make(variant, **SHAPES[shape])
    model = build_model(cfg)
    two = saved_activation_bytes(model, 4, cfg.seq_len, cfg.vocab_size) - saved_activation_bytes(
        model, 2, cfg.seq_len, cfg.vocab_size
    )
    analytic = training_memory(cfg, Workload(micro_batch=2, seq_len=cfg.seq_len)).activation_bytes
    assert two == pytest.approx(analytic, rel=0.02)


# -- inference -------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_the_training_forward(variant: str) -> None:
    cfg = make(variant, n_kv_heads=2)
    model = build_model(cfg).eval()
    perturb(model, 0.1)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    full = model(idx)[0]
    cache = model.new_cache()
    first = model.step(idx[:, :12], cache)
    rest = torch.cat([model.step(idx[:, t : t + 1], cache) for t in range(12, 20)], dim=1)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-4, atol=1e-4)


def test_kv_cache_is_written_in_place_and_grows_by_doubling() -> None:
    """Appending a token writes it into the buffers (no copy of the cache per step); they grow
    by doubling, never past the model's context; decoding still equals the forward."""
    model = build_model(make("baseline", n_kv_heads=2)).eval()  # seq_len 32
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache()
    logits = [model.step(idx[:, :5], cache)]
    seen = []  # (capacity, buffer) after each token
    for t in range(5, 32):
        logits.append(model.step(idx[:, t : t + 1], cache))
        k = cache.k[0]
        assert k is not None
        seen.append((k.shape[2], k.data_ptr()))
    assert cache.k[0] is not None
    assert cache.k[0].shape == (2, 2, 32, 16)  # (B, H_kv, capacity, Dh)
    assert sorted({c for c, _ in seen}) == [10, 20, 32]  # 5 → 10 → 20 → 32 (the context)
    for (c0, b0), (c1, b1) in itertools.pairwise(seen):
        assert (b0 == b1) == (c0 == c1)  # a new buffer only when the cache grows
    torch.testing.assert_close(torch.cat(logits, 1), model(idx)[0], rtol=1e-4, atol=1e-4)


def test_inference_then_training_on_one_model() -> None:
    """`step` runs in inference mode; nothing it leaves behind (the depth stack's reused
    buffers) may reach a later training step, which could not write to inference tensors."""
    for variant in ("full_attnres", "block_attnres"):
        model = build_model(make(variant))
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
        for schedule in model.mixer.schedules:
            model.step(idx, model.new_cache(), schedule)
            _, loss = model(idx, idx)
            assert loss is not None
            loss.backward()


# -- causality, gradients, determinism --------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant: str) -> None:
    model = build_model(make(variant))
    perturb(model, 0.1)
    idx = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[0, 20] = (idx[0, 20] + 1) % 256
    a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_reach_every_parameter(variant: str) -> None:
    model = build_model(
        make(variant, mlp="swiglu", norm="layernorm", bias=True, positions="learned")
    )
    perturb(model, 0.05)
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    _, loss = model(idx, idx.roll(-1, 1))
    assert loss is not None
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_same_seed_same_loss(variant: str) -> None:
    def loss(seed: int) -> float:
        torch.manual_seed(seed)
        model = build_model(make(variant))
        idx = torch.randint(0, 256, (2, 32))
        value = model(idx, idx.roll(-1, 1))[1]
        assert value is not None
        return float(value.item())

    assert loss(0) == loss(0)
    assert loss(0) != loss(1)


def test_sdpa_and_math_attention_agree() -> None:
    cfg = make("baseline", n_kv_heads=2)
    a = build_model(cfg)
    b = build_model(cfg, attn_impl="math")
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a(idx)[0], b(idx)[0], rtol=1e-5, atol=1e-5)


def test_norm_epsilon_never_decides_the_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """REFERENCE.md §1: at 32 sublayers the mean of the sources has a mean square near 1e-6,
    where a usual 1e-5 epsilon would change the logits; ours must not."""
    torch.manual_seed(0)
    model = build_model(
        ArchConfig(n_layers=16, d_model=64, n_heads=4, variant="full_attnres", seq_len=32)
    )
    idx = torch.randint(0, 256, (2, 32))

    def logits(eps: float) -> torch.Tensor:
        monkeypatch.setattr(layers_module, "NORM_EPS", eps)
        logits: torch.Tensor = model(idx)[0]
        return logits

    exact = logits(0.0)
    ours = logits(layers_module.NORM_EPS if layers_module.NORM_EPS else 1e-10)
    monkeypatch.undo()
    assert (ours - exact).abs().max() < 1e-4
    assert (logits(1e-5) - exact).abs().max() > 10 * (ours - exact).abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_bf16_autocast_trains(variant: str) -> None:
    cfg = make(variant)
    model = build_model(cfg).cuda()
    idx = torch.randint(0, 256, (2, 32), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(idx, idx.roll(-1, 1))
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
