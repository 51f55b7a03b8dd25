"""One conformance suite run over every residual variant: shapes and parameters agree with the
cost model, FLOPs and saved activations agree with PyTorch's own counters, the AttnRes
definitions hold (REFERENCE.md §1–2), and the model is causal, trainable and deterministic."""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import math
from typing import Any

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
from workers.model import (
    BlockAttnRes,
    FullAttnRes,
    build_model,
    depth_attend,
    depth_attention,
    native,
    rms_normalize,
)
from workers.model import layers as layers_module
from workers.model.depth_attention import rms_scale

SHAPES = [
    {},
    {"mlp": "swiglu", "norm": "layernorm", "positions": "learned", "bias": True},
    {"n_kv_heads": 2, "tie_embeddings": False, "vocab_size": 97},
    {"n_layers": 5, "d_model": 96, "n_heads": 6, "d_ff": 200},
]


def make(variant: str, block_size: int | None = 3, **kw: object) -> ArchConfig:
    base: dict[str, object] = {"n_layers": 3, "d_model": 64, "n_heads": 4, "seq_len": 32}
    base.update(kw)
    return ArchConfig(
        variant=variant,
        block_size=block_size if variant == "block_attnres" else None,
        **base,  # type: ignore[arg-type]
    )


def perturb(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """Move every parameter off its initial value (zero-init queries make many paths trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


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


# -- the AttnRes definitions -----------------------------------------------------------------
def paper_sources(
    variant: str, block_size: int, emb: torch.Tensor, outs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The sources of the next sublayer after `outs`, straight from REFERENCE.md §1."""
    if variant != "block_attnres":
        return [emb, *outs]
    l = len(outs)  # index of the next sublayer
    n = l // block_size  # the next sublayer is in block n (0-based)
    blocks = [sum(outs[b * block_size : (b + 1) * block_size]) for b in range(n)]
    partial = outs[n * block_size : l]
    return [emb, *blocks] + ([sum(partial)] if partial else [])  # a zero partial is no source


def drive(
    mixer: torch.nn.Module, emb: torch.Tensor, outs: list[torch.Tensor], finish: bool = False
) -> list[torch.Tensor]:
    """Feed fixed outputs through a mixer; return every sublayer input (and, with `finish`,
    the mixer's output last)."""
    state = mixer.begin(emb)
    inputs = []
    for l, out in enumerate(outs):
        inputs.append(mixer.input(state, l))
        mixer.record(state, l, out)
    return [*inputs, mixer.finish(state)] if finish else inputs


@pytest.mark.parametrize(
    ("variant", "block_size"),
    [("full_attnres", None), ("attnres_no_key_norm", None), ("attnres_input_query", None)]
    + [("block_attnres", s) for s in (1, 2, 3, 5, 12)],
)
def test_initial_inputs_are_the_mean_of_the_sources(variant: str, block_size: int | None) -> None:
    cfg = make(variant, block_size=block_size, n_layers=6)
    model = build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(2, 5, 64, generator=gen)
    outs = [torch.randn(2, 5, 64, generator=gen) for _ in range(cfg.n_sublayers)]
    inputs = drive(model.mixer, emb, outs)
    for l, h in enumerate(inputs):
        sources = paper_sources(variant, block_size or 1, emb, outs[:l])
        torch.testing.assert_close(h, torch.stack(sources).mean(0), rtol=1e-5, atol=1e-6)


def test_sigmoid_ablation_starts_at_half_the_sum() -> None:
    model = build_model(make("attnres_sigmoid"))
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 3, 64, generator=gen)
    outs = [torch.randn(1, 3, 64, generator=gen) for _ in range(6)]
    inputs = drive(model.mixer, emb, outs)
    torch.testing.assert_close(inputs[3], 0.5 * (emb + sum(outs[:3])))


@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 5, 12])
def test_block_attnres_matches_the_definition_with_trained_queries(block_size: int) -> None:
    """Non-zero queries and gains: every input is the softmax over the paper's sources with
    RMSNorm keys, no 1/√d."""
    cfg = make("block_attnres", block_size=block_size, n_layers=6)
    model = build_model(cfg)
    perturb(model, 0.5)
    mixer = model.mixer
    gen = torch.Generator().manual_seed(3)
    emb = torch.randn(2, 4, 64, generator=gen)
    outs = [torch.randn(2, 4, 64, generator=gen) for _ in range(cfg.n_sublayers)]
    inputs = drive(mixer, emb, outs)
    for l, h in enumerate(inputs):
        sources = paper_sources("block_attnres", block_size, emb, outs[:l])
        q = mixer.queries[l] * mixer.key_gains[l]
        logits = torch.stack([(rms_normalize(s) * q).sum(-1) for s in sources])
        ref = (logits.softmax(0)[..., None] * torch.stack(sources)).sum(0)
        torch.testing.assert_close(h, ref, rtol=1e-5, atol=1e-5)


def test_block_size_one_is_full_attnres() -> None:
    full = build_model(make("full_attnres", n_layers=4))
    perturb(full, 0.5)
    block = build_model(make("block_attnres", block_size=1, n_layers=4))
    block.load_state_dict(full.state_dict())
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(block(idx)[0], full(idx)[0], rtol=0, atol=1e-6)


def test_one_block_is_a_standard_residual_with_the_embedding_apart() -> None:
    """S = L: every sublayer mixes exactly two sources, the embedding and the running sum of
    all earlier outputs (the standard residual stream without the embedding)."""
    cfg = make("block_attnres", block_size=8, n_layers=4)
    mixer = build_model(cfg).mixer
    perturb(mixer, 0.5)
    gen = torch.Generator().manual_seed(5)
    emb = torch.randn(1, 3, 64, generator=gen)
    outs = [torch.randn(1, 3, 64, generator=gen) for _ in range(8)]
    inputs = drive(mixer, emb, outs)
    torch.testing.assert_close(inputs[0], emb)
    for l in range(1, 8):
        stream = sum(outs[:l])
        q = mixer.queries[l] * mixer.key_gains[l]
        a = torch.stack(
            [(rms_normalize(emb) * q).sum(-1), (rms_normalize(stream) * q).sum(-1)]
        ).softmax(0)
        torch.testing.assert_close(inputs[l], a[0, ..., None] * emb + a[1, ..., None] * stream)


def test_hand_check_weight_098201() -> None:
    """REFERENCE.md: sources [1,0,0,0] and [0,1,0,0], w = [2,0,0,0] → RMSNorm keys [2,0,0,0]
    and [0,2,0,0], logits 4 and 0, weight on the first 0.98201."""
    v0 = torch.tensor([1.0, 0, 0, 0]).view(1, 1, 4)
    v1 = torch.tensor([0, 1.0, 0, 0]).view(1, 1, 4)
    torch.testing.assert_close(rms_normalize(v0), torch.tensor([2.0, 0, 0, 0]).view(1, 1, 4))
    w = torch.tensor([2.0, 0, 0, 0])
    h = depth_attend(w, [v0, v1], [rms_scale(v0), rms_scale(v1)])
    assert h[0, 0, 0].item() == pytest.approx(0.98201, abs=5e-6)
    assert h[0, 0, 1].item() == pytest.approx(1 - 0.98201, abs=5e-6)
    # and through a Full AttnRes mixer with that pseudo-query on sublayer 1
    mixer = FullAttnRes(ArchConfig(n_layers=1, d_model=4, n_heads=1, variant="full_attnres"))
    with torch.no_grad():
        mixer.queries[1] = w
    state = mixer.begin(v0)
    mixer.record(state, 0, v1)
    assert mixer.input(state, 1)[0, 0, 0].item() == pytest.approx(0.98201, abs=5e-6)


# -- two-phase inference ---------------------------------------------------------------------
def run_schedules(model: torch.nn.Module, idx: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """Prefill 16 tokens, then decode the rest one by one, under both schedules; keep the
    logits and the depth path's output (the input of the final norm)."""
    hidden: list[torch.Tensor] = []
    hook = model.norm_f.register_forward_pre_hook(lambda _, args: hidden.append(args[0]))
    out = {}
    for schedule in ("sequential", "two_phase"):
        hidden.clear()
        cache = model.new_cache()
        logits = [model.step(idx[:, :16], cache, schedule)]
        logits += [model.step(idx[:, t : t + 1], cache, schedule) for t in range(16, idx.shape[1])]
        out[schedule] = {
            "prefill_logits": logits[0],
            "decode_logits": torch.cat(logits[1:], dim=1),
            "prefill_hidden": hidden[0],
            "decode_hidden": torch.cat(hidden[1:], dim=1),
        }
    hook.remove()
    return out


TWO_PHASE_SHAPES = [(3, 1), (3, 2), (3, 4), (4, 3), (5, 3), (4, 8), (6, 5)]  # (L_b, S)


@pytest.fixture(params=["native", "online", "per_block"])
def two_phase_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Two-phase inference runs online up to `ONLINE_LIMIT` state elements, on the compiled
    kernels (`NativeDepth`) where they serve, else on torch operations (`OnlineDepth`), and
    per block above the limit: each test below runs under all three, and checks that the
    path under test was the one taken."""
    if request.param == "per_block":
        monkeypatch.setattr(depth_attention, "ONLINE_LIMIT", 0)
    if request.param == "native":
        assert native.kernels() is not None, "the C compiler is part of the set-up"
        switch = contextlib.nullcontext()
    else:
        switch = native.disabled()
    made = {"native": 0, "online": 0}
    for name, cls in (("native", native.NativeDepth), ("online", depth_attention.OnlineDepth)):
        real = cls.__init__

        def counting(self: object, *args: object, _real: Any = real, _name: str = name) -> None:
            made[_name] += 1
            _real(self, *args)

        monkeypatch.setattr(cls, "__init__", counting)
    with switch:
        yield request.param
    assert {k for k, n in made.items() if n} == ({request.param} - {"per_block"})


@pytest.mark.parametrize(("n_layers", "block_size"), TWO_PHASE_SHAPES)
def test_two_phase_equals_sequential_in_prefill_and_decode(
    n_layers: int, block_size: int, two_phase_impl: str
) -> None:
    """fp32: the depth path's output agrees to max abs 1e-5 in prefill and in token-by-token
    decode (S = 5 on 12 sublayers and S = 3 on 10 leave an uneven last block); the logits,
    after the final norm's 1/rms amplification, to 1e-4; both match the training forward."""
    torch.manual_seed(n_layers * 10 + block_size)
    cfg = make("block_attnres", block_size=block_size, n_layers=n_layers)
    model = build_model(cfg).eval()
    perturb(model.mixer, 1.0, seed=block_size)  # queries far from uniform
    assert isinstance(model.mixer, BlockAttnRes)
    idx = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(7))
    out = run_schedules(model, idx)
    seq, two = out["sequential"], out["two_phase"]
    for key in ("prefill_hidden", "decode_hidden"):
        assert (two[key] - seq[key]).abs().max() <= 1e-5, key
    for key in ("prefill_logits", "decode_logits"):
        assert (two[key] - seq[key]).abs().max() <= 1e-4, key
    full = model(idx)[0]
    both = torch.cat([two["prefill_logits"], two["decode_logits"]], dim=1)
    torch.testing.assert_close(both, full, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(("n_layers", "block_size"), TWO_PHASE_SHAPES)
def test_two_phase_is_exact_in_float64(n_layers: int, block_size: int, two_phase_impl: str) -> None:
    """In fp64 the reordering leaves nothing but rounding: the schedules agree to 1e-12."""
    torch.manual_seed(0)
    model = build_model(make("block_attnres", block_size=block_size, n_layers=n_layers))
    model = model.double().eval()
    perturb(model.mixer, 1.0, seed=block_size)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    out = run_schedules(model, idx)
    for key in ("prefill_logits", "decode_logits", "prefill_hidden", "decode_hidden"):
        assert (out["two_phase"][key] - out["sequential"][key]).abs().max() <= 1e-12, key


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
        seen.append((cache.k[0].shape[2], cache.k[0].data_ptr()))
    assert cache.k[0].shape == (2, 2, 32, 16)  # (B, H_kv, capacity, Dh)
    assert sorted({c for c, _ in seen}) == [10, 20, 32]  # 5 → 10 → 20 → 32 (the context)
    for (c0, b0), (c1, b1) in itertools.pairwise(seen):
        assert (b0 == b1) == (c0 == c1)  # a new buffer only when the cache grows
    torch.testing.assert_close(torch.cat(logits, 1), model(idx)[0], rtol=1e-4, atol=1e-4)


def test_online_queries_follow_the_parameters() -> None:
    """The online path derives its scaled queries once per parameter state: an in-place
    update (an optimiser step), a loaded state and a replaced parameter are all seen."""
    torch.manual_seed(0)
    model = build_model(make("block_attnres", block_size=2, n_layers=3)).eval()
    idx = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    mixer = model.mixer

    def agree() -> torch.Tensor:
        two = model.step(idx, model.new_cache(), "two_phase")
        torch.testing.assert_close(two, model.step(idx, model.new_cache(), "sequential"))
        return two

    first = agree()
    with torch.no_grad():
        mixer.queries[1] += 0.5  # in place, as an optimiser does
    second = agree()
    assert not torch.allclose(first, second)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["mixer.key_gains"] = state["mixer.key_gains"] * 2  # (sublayer 1 has a query)
    model.load_state_dict(state)
    third = agree()
    assert not torch.allclose(second, third)
    mixer.agg_query = torch.nn.Parameter(torch.full_like(mixer.agg_query, 0.3))
    assert not torch.allclose(third, agree())
    model.double()  # the same parameters, their storage swapped
    assert agree().dtype == torch.float64


def test_a_model_that_decoded_copies_and_saves() -> None:
    """What decoding derives (the scaled queries, the kernels' plans) is not part of the
    model: a deep copy and a saved model decode the same as the original."""
    model = build_model(make("block_attnres", block_size=2)).eval()
    perturb(model.mixer, 1.0)
    idx = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(3))
    first = model.step(idx, model.new_cache())
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        torch.testing.assert_close(other.step(idx, other.new_cache()), first)


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


@pytest.mark.parametrize(
    "variant", ["attnres_input_query", "attnres_sigmoid", "attnres_no_key_norm"]
)
def test_two_phase_is_refused_where_it_does_not_apply(variant: str) -> None:
    """The ablations (an input-dependent query, a sigmoid, raw keys) have no two-phase form:
    they decode sequentially by default and refuse the schedule when asked for it."""
    model = build_model(make(variant))
    assert model.mixer.inference_schedule == "sequential"
    with pytest.raises(ValueError, match="schedule"):
        model.step(torch.zeros(1, 4, dtype=torch.long), model.new_cache(), "two_phase")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_layers", [2, 3, 5])
def test_full_attnres_two_phase_equals_sequential(
    n_layers: int, dtype: torch.dtype, two_phase_impl: str
) -> None:
    """Full AttnRes decodes on the same schedule with one sublayer per block (its default):
    prefill and token-by-token decode equal the depth stack's sequential path, fp32 to 1e-5
    and fp64 to 1e-12, and the training forward."""
    torch.manual_seed(n_layers)
    model = build_model(make("full_attnres", n_layers=n_layers)).to(dtype).eval()
    assert model.mixer.inference_schedule == "two_phase"
    perturb(model.mixer, 1.0, seed=n_layers)
    idx = torch.randint(0, 256, (2, 22), generator=torch.Generator().manual_seed(5))
    out = run_schedules(model, idx)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for key in ("prefill_hidden", "decode_hidden"):
        assert (out["two_phase"][key] - out["sequential"][key]).abs().max() <= tol, key
    both = torch.cat([out["two_phase"]["prefill_logits"], out["two_phase"]["decode_logits"]], 1)
    torch.testing.assert_close(both, model(idx)[0], rtol=1e-4, atol=1e-3)


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
        return value.item()

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
        return model(idx)[0]

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


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 12])
def test_two_phase_is_differentiable_and_equals_sequential_gradients(block_size: int) -> None:
    """The two-phase schedule also trains: loss and every parameter's gradient equal the
    sequential path's (fp64, 1e-10)."""
    cfg = make("block_attnres", block_size=block_size, n_layers=6, d_model=32, n_heads=2)
    model = build_model(cfg).double()
    perturb(model, 0.3)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    results = {}
    for schedule in ("sequential", "two_phase"):
        model.zero_grad()
        _, loss = model(idx, idx.roll(-1, 1), schedule=schedule)
        assert loss is not None
        loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results[schedule] = (loss.item(), grads)
    (seq_loss, seq), (two_loss, two) = results["sequential"], results["two_phase"]
    assert seq_loss == pytest.approx(two_loss, abs=1e-12)
    assert seq.keys() == two.keys() == {k for k, _ in model.named_parameters()}
    for name in seq:
        torch.testing.assert_close(two[name], seq[name], rtol=1e-10, atol=1e-10)


# -- fused mixers against their plain definitions ---------------------------------------------
def fp64_mixer_and_sources(
    cfg: ArchConfig, tokens: int, seed: int
) -> tuple[torch.nn.Module, torch.Tensor, list[torch.Tensor]]:
    """A float64 mixer with every parameter moved well off its initial value, and a random
    embedding and sublayer outputs (2 sequences of `tokens`) that require gradients."""
    mixer = build_model(cfg).double().mixer
    perturb(mixer, 0.5, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    shape = (2, tokens, cfg.d_model)
    emb, *outs = (
        torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)
        for _ in range(cfg.n_sublayers + 1)
    )
    return mixer, emb, outs


def assert_same_with_gradients(
    ours: list[torch.Tensor], ref: list[torch.Tensor], wanted: list[torch.Tensor]
) -> None:
    """Equal values (1e-12) and equal gradients of `wanted` (1e-10) through a probe that
    weighs every result differently."""

    def through(results: list[torch.Tensor]) -> list[torch.Tensor]:
        probe = sum((h.sin() * (i + 1)).sum() for i, h in enumerate(results))
        return list(torch.autograd.grad(probe, wanted))

    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(through(ours), through(ref), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


# -- mHC-lite against its definition ----------------------------------------------------------
def mhc_reference(mixer: torch.nn.Module, emb: torch.Tensor, outs: list[torch.Tensor]) -> tuple:
    """mHC-lite straight from its definition (arXiv 2601.05732) in plain autograd: every sublayer
    input and the output, from fixed sublayer outputs."""
    n = mixer.n
    X = emb[:, :, None, :].expand(-1, -1, n, -1)
    inputs = []
    for l, f in enumerate(outs):
        B, T, _, d = X.shape
        c = rms_normalize(X.reshape(B, T, n * d)) @ mixer.proj[l]
        g, b = mixer.gates[l], mixer.bias[l]
        pre = torch.sigmoid(g[0] * c[..., :n] + b[:n])
        post = 2 * torch.sigmoid(g[1] * c[..., n : 2 * n] + b[n : 2 * n])
        weights = torch.softmax(g[2] * c[..., 2 * n :] + b[2 * n :], dim=-1)
        H_res = torch.einsum("btp,pij->btij", weights, mixer.perm_mats.to(X.dtype))
        inputs.append(torch.einsum("btn,btnd->btd", pre, X))
        X = torch.einsum("btij,btjd->btid", H_res, X) + post[..., None] * f[:, :, None, :]
    return inputs, X.sum(dim=2)


def test_mhc_lite_equals_its_definition_with_gradients() -> None:
    """The fused stream functions against the plain definition, fp64: every sublayer input,
    the output, and the gradients of the embedding, the sublayer outputs and every parameter
    (1e-10), with all parameters moved well off their initial values."""
    cfg = make("mhc_lite", n_layers=4, d_model=32, n_heads=2)
    mixer, emb, outs = fp64_mixer_and_sources(cfg, tokens=7, seed=3)
    ours = drive(mixer, emb, outs, finish=True)
    ref_inputs, ref_out = mhc_reference(mixer, emb, outs)
    assert_same_with_gradients(ours, [*ref_inputs, ref_out], [emb, *outs, *mixer.parameters()])


def test_mhc_lite_initial_state_and_doubly_stochastic_mixing() -> None:
    """At initialisation the first input is the embedding (H_pre = 1/n on n copies) and
    H_post = 1; for any parameters H_res is doubly stochastic and H_post lies in [0, 2]."""
    model = build_model(make("mhc_lite"))
    mixer = model.mixer
    emb = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    state = mixer.begin(emb)
    torch.testing.assert_close(mixer.input(state, 0), emb, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["H_post"], torch.ones(2, 5, mixer.n))
    perturb(mixer, 2.0, seed=1)
    state = mixer.begin(emb)
    for l in range(mixer.n_sublayers):
        mixer.input(state, l)
        H = state["H_res"]
        torch.testing.assert_close(H.sum(-1), torch.ones(2, 5, mixer.n))
        torch.testing.assert_close(H.sum(-2), torch.ones(2, 5, mixer.n))
        post = state["H_post"]
        assert bool((H >= 0).all()) and bool(((post >= 0) & (post <= 2)).all())
        mixer.record(state, l, torch.randn(2, 5, 64))


@pytest.mark.parametrize(
    "variant", ["full_attnres", "attnres_input_query", "attnres_sigmoid", "attnres_no_key_norm"]
)
@pytest.mark.parametrize("n_sources", [1, 2, 5])
def test_inference_paths_of_depth_attention_agree(
    variant: str, n_sources: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two no-grad paths of `depth_attend` (per source, and stacked for decoding-sized
    inputs) and the autograd path give the same result (fp64, 1e-12)."""
    from workers.model import depth_attention

    gen = torch.Generator().manual_seed(n_sources)
    values = [torch.randn(2, 3, 16, dtype=torch.float64, generator=gen) for _ in range(n_sources)]
    dynamic = variant == "attnres_input_query"
    shape = (2, 3, 16) if dynamic else (16,)
    query = torch.randn(*shape, dtype=torch.float64, generator=gen)
    scales = None if variant == "attnres_no_key_norm" else [rms_scale(v) for v in values]
    gate = "sigmoid" if variant == "attnres_sigmoid" else "softmax"
    with torch.enable_grad():
        reference = depth_attend(query.requires_grad_(), values, scales, gate).detach()
    results = []
    for limit in (0, 1 << 30):
        monkeypatch.setattr(depth_attention, "STACK_LIMIT", limit)
        with torch.no_grad():
            results.append(depth_attend(query, values, scales, gate))
    for result in results:
        torch.testing.assert_close(result, reference, rtol=1e-12, atol=1e-12)


# -- the depth stack (static-query AttnRes) against its definition ------------------------------
def attnres_reference(
    mixer: torch.nn.Module, variant: str, emb: torch.Tensor, outs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Every sublayer input and the aggregation straight from REFERENCE.md §1 in plain autograd:
    the gate over the paper's sources with RMSNorm keys (raw keys for the ablation)."""
    block_size = mixer.block_size if variant == "block_attnres" else 1
    key_norm = variant != "attnres_no_key_norm"
    results = []
    for l in range(len(outs) + 1):
        if l < len(outs):
            sources = paper_sources(variant, block_size, emb, outs[:l])
            q, gain = mixer.queries[l], mixer.key_gains[l] if key_norm else None
        else:  # the aggregation: the embedding and every block (Full: every output)
            n = -(-len(outs) // block_size)
            blocks = [sum(outs[b * block_size : (b + 1) * block_size]) for b in range(n)]
            sources = [emb, *blocks]
            q, gain = mixer.agg_query, mixer.agg_key_gain if key_norm else None
        keys = [rms_normalize(s) * gain if gain is not None else s for s in sources]
        logits = torch.stack([(k * q).sum(-1) for k in keys])
        weights = logits.sigmoid() if variant == "attnres_sigmoid" else logits.softmax(0)
        results.append((weights[..., None] * torch.stack(sources)).sum(0))
    return results


@pytest.mark.parametrize(
    ("variant", "block_size"),
    [("full_attnres", None), ("attnres_sigmoid", None), ("attnres_no_key_norm", None)]
    + [("block_attnres", s) for s in (1, 2, 3, 4, 10)],
)
def test_depth_stack_equals_the_definition_with_gradients(
    variant: str, block_size: int | None
) -> None:
    """Every sublayer input, the aggregation, and the gradients of the embedding, of every
    sublayer output and of every parameter equal the plain-autograd definition (fp64, 1e-10),
    with queries and gains well off their initial values; uneven last blocks included."""
    cfg = make(variant, block_size=block_size, n_layers=5, d_model=16, n_heads=2)
    mixer, emb, outs = fp64_mixer_and_sources(cfg, tokens=5, seed=2)
    ours = drive(mixer, emb, outs, finish=True)
    ref = attnres_reference(mixer, variant, emb, outs)
    assert_same_with_gradients(ours, ref, [emb, *outs, *mixer.parameters()])


@pytest.mark.parametrize("variant", ["full_attnres", "block_attnres"])
def test_depth_stacks_in_flight_together_and_kept_graphs(variant: str) -> None:
    """The stack's reused buffers never leak between forward passes: two forwards in flight at
    once (backward in the reverse order), a graph kept for a second backward, and a forward
    under no_grad in between all give the gradients of one forward and backward alone."""
    model = build_model(make(variant, n_layers=3)).double()
    perturb(model, 0.3)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, 256, (2, 16), generator=gen) for _ in range(2))

    def grads(idx: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        model(idx, idx.roll(-1, 1))[1].backward()
        return [p.grad.clone() for p in model.parameters()]

    alone_a, alone_b = grads(a), grads(b)
    model.zero_grad()
    loss_a = model(a, a.roll(-1, 1))[1]
    loss_b = model(b, b.roll(-1, 1))[1]
    with torch.no_grad():
        model(b)
    torch.autograd.backward(loss_b, retain_graph=True)
    got_b = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.autograd.backward(loss_a)
    got_a = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.autograd.backward(loss_b)  # the kept graph, a second time
    again_b = [p.grad.clone() for p in model.parameters()]
    for want, *got in zip(alone_a, got_a, strict=True):
        torch.testing.assert_close(got[0], want, rtol=1e-12, atol=1e-12)
    for want, g1, g2 in zip(alone_b, got_b, again_b, strict=True):
        torch.testing.assert_close(g1, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g2, want, rtol=1e-12, atol=1e-12)


def test_depth_stack_refuses_out_of_order_use() -> None:
    mixer = build_model(make("full_attnres", n_layers=2)).mixer
    emb = torch.randn(1, 3, 64)
    state = mixer.begin(emb)
    mixer.input(state, 2)
    with pytest.raises(ValueError, match=r"use 1 is not in 3\.\.4"):
        mixer.input(state, 1)


def test_depth_stack_workspace_is_bounded_and_keeps_the_latest_shapes() -> None:
    """Buffers come back per shape (at most `keep` each), the total held never exceeds the
    limit (the least recently used shapes go first), a buffer over a quarter of the limit is
    never held, and a taken buffer is not handed out twice."""
    from workers.model.depth_stack import _Workspace

    cpu, f32 = torch.device("cpu"), torch.float32
    ws = _Workspace(keep=2, limit=8192)  # bytes
    a, b, c = (ws.take((512,), f32, cpu) for _ in range(3))  # 2 KiB each
    ws.give(a, b, c)
    assert ws.held == 4096  # two per shape
    taken = [ws.take((512,), f32, cpu) for _ in range(3)]
    assert {id(t) for t in taken[:2]} == {id(a), id(b)} and taken[2] is not c
    assert ws.held == 0
    ws.give(a, b)
    ws.give(*(ws.take((256,), f32, cpu) for _ in range(2)))  # 6 KiB held
    ws.give(*(ws.take((384,), f32, cpu) for _ in range(2)))  # 9 KiB: the oldest shape goes
    assert ws.held == 5120 <= ws.limit
    assert [key[0] for key in ws.free] == [(256,), (384,)]
    ws.give(torch.empty(1024))  # 4 KiB, over a quarter of the limit
    assert ws.held == 5120


@pytest.mark.parametrize("gate", ["softmax", "sigmoid"])
@pytest.mark.parametrize("key_norm", [True, False])
def test_depth_stack_with_a_source_outside_it_equals_the_definition(
    gate: str, key_norm: bool
) -> None:
    """The stack API itself: sources pushed between uses, a source outside the stack on some
    uses, either gate, with or without key norms; values and the gradients of the queries,
    the stack sources and the outside sources equal plain autograd (fp64)."""
    from workers.model.depth_stack import DepthStack

    gen = torch.Generator().manual_seed(7)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)

    queries, first = rand(5, 8), rand(2, 3, 8)
    pushed, outside = [rand(2, 3, 8) for _ in range(3)], [rand(2, 3, 8) for _ in range(3)]
    # use: (sources pushed before it, outside source or None)
    plan = [(0, 0), (0, None), (1, 1), (2, 2), (3, None)]

    def scale(v: torch.Tensor) -> torch.Tensor | None:
        return rms_scale(v) if key_norm else None

    stack = DepthStack(queries, first, 4, key_norm, gate)
    ours, ref = [], []
    for use, (n_pushed, out) in enumerate(plan):
        while stack.stack.n < n_pushed + 1:
            stack.push(pushed[stack.stack.n - 1])
        extra = None if out is None else outside[out]
        ours.append(stack.attend(use, extra, None if extra is None else scale(extra)))
        sources = [first, *pushed[:n_pushed]] + ([] if extra is None else [extra])
        keys = [rms_normalize(v) if key_norm else v for v in sources]
        logits = torch.stack([(k * queries[use]).sum(-1) for k in keys])
        weights = logits.softmax(0) if gate == "softmax" else logits.sigmoid()
        ref.append((weights[..., None] * torch.stack(sources)).sum(0))
    assert_same_with_gradients(ours, ref, [queries, first, *pushed, *outside])
