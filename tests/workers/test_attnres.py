"""The AttnRes definitions (REFERENCE.md §1–2), held by both implementations of every AttnRes
mixer (the reference forward and the fast path), and the two-phase schedule: equal to the
sequential one in prefill and decode, exact in float64, differentiable, Full AttnRes as S = 1."""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from cost_model import ArchConfig
from workers.model import (
    IMPLS,
    BlockAttnRes,
    FullAttnRes,
    Impl,
    build_model,
    depth_attend,
    depth_attention,
    rms_normalize,
)
from workers.model.depth_attention import rms_scale

from .support import drive, make, paper_sources, perturb, run_schedules

each_impl = pytest.mark.parametrize("impl", IMPLS)


# -- the definitions -------------------------------------------------------------------------
@each_impl
@pytest.mark.parametrize(
    ("variant", "block_size"),
    [("full_attnres", None), ("attnres_no_key_norm", None), ("attnres_input_query", None)]
    + [("block_attnres", s) for s in (1, 2, 3, 5, 12)],
)
def test_initial_inputs_are_the_mean_of_the_sources(
    variant: str, block_size: int | None, impl: Impl
) -> None:
    cfg = make(variant, block_size=block_size, n_layers=6)
    model = build_model(cfg, mixer_impl=impl)
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(2, 5, 64, generator=gen)
    outs = [torch.randn(2, 5, 64, generator=gen) for _ in range(cfg.n_sublayers)]
    inputs = drive(model.mixer, emb, outs)
    for l, h in enumerate(inputs):
        sources = paper_sources(variant, block_size or 1, emb, outs[:l])
        torch.testing.assert_close(h, torch.stack(sources).mean(0), rtol=1e-5, atol=1e-6)


@each_impl
def test_sigmoid_ablation_starts_at_half_the_sum(impl: Impl) -> None:
    model = build_model(make("attnres_sigmoid"), mixer_impl=impl)
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 3, 64, generator=gen)
    outs = [torch.randn(1, 3, 64, generator=gen) for _ in range(6)]
    inputs = drive(model.mixer, emb, outs)
    torch.testing.assert_close(inputs[3], 0.5 * (emb + sum(outs[:3])))


@each_impl
@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 5, 12])
def test_block_attnres_matches_the_definition_with_trained_queries(
    block_size: int, impl: Impl
) -> None:
    """Non-zero queries and gains: every input is the softmax over the paper's sources with
    RMSNorm keys, no 1/√d."""
    cfg = make("block_attnres", block_size=block_size, n_layers=6)
    model = build_model(cfg, mixer_impl=impl)
    perturb(model, 0.5)
    mixer = model.mixer
    assert isinstance(mixer, BlockAttnRes) and mixer.key_gains is not None
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


@each_impl
def test_block_size_one_is_full_attnres(impl: Impl) -> None:
    full = build_model(make("full_attnres", n_layers=4), mixer_impl=impl)
    perturb(full, 0.5)
    block = build_model(make("block_attnres", block_size=1, n_layers=4), mixer_impl=impl)
    block.load_state_dict(full.state_dict())
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(block(idx)[0], full(idx)[0], rtol=0, atol=1e-6)


@each_impl
def test_one_block_is_a_standard_residual_with_the_embedding_apart(impl: Impl) -> None:
    """S = L: every sublayer mixes exactly two sources, the embedding and the running sum of
    all earlier outputs (the standard residual stream without the embedding)."""
    cfg = make("block_attnres", block_size=8, n_layers=4)
    mixer = build_model(cfg, mixer_impl=impl).mixer
    assert isinstance(mixer, BlockAttnRes) and mixer.key_gains is not None
    perturb(mixer, 0.5)
    gen = torch.Generator().manual_seed(5)
    emb = torch.randn(1, 3, 64, generator=gen)
    outs = [torch.randn(1, 3, 64, generator=gen) for _ in range(8)]
    inputs = drive(mixer, emb, outs)
    torch.testing.assert_close(inputs[0], emb)
    for l in range(1, 8):
        stream = sum(outs[:l])
        assert isinstance(stream, torch.Tensor)  # l >= 1 outputs
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
    cfg = ArchConfig(n_layers=1, d_model=4, n_heads=1, variant="full_attnres")
    mixer = FullAttnRes(cfg)
    with torch.no_grad():
        mixer.queries[1] = w
    state = mixer.begin(v0)
    mixer.record(state, 0, v1)
    assert mixer.input(state, 1)[0, 0, 0].item() == pytest.approx(0.98201, abs=5e-6)
    # and through the reference forward of the same variant
    ref = FullAttnRes(cfg, "reference")
    with torch.no_grad():
        ref.queries[1] = w
    assert drive(ref, v0, [v1, v1])[1][0, 0, 0].item() == pytest.approx(0.98201, abs=5e-6)


# -- two-phase inference ---------------------------------------------------------------------
TWO_PHASE_SHAPES = [(3, 1), (3, 2), (3, 4), (4, 3), (5, 3), (4, 8), (6, 5)]  # (L_b, S)


@pytest.fixture(params=["online", "per_block"])
def two_phase_impl(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Two-phase inference runs online (`OnlineDepth`) up to `ONLINE_LIMIT` state elements and
    per block above the limit: each test below runs under both, and checks that the path under
    test was the one taken."""
    if request.param == "per_block":
        monkeypatch.setattr(depth_attention, "ONLINE_LIMIT", 0)
    made = {"online": 0}
    real = depth_attention.OnlineDepth.__init__

    def counting(self: depth_attention.OnlineDepth, *args: Any) -> None:
        made["online"] += 1
        real(self, *args)

    monkeypatch.setattr(depth_attention.OnlineDepth, "__init__", counting)
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


@pytest.mark.parametrize("variant", ["full_attnres", "block_attnres"])
def test_the_reference_has_no_two_phase_schedule(variant: str) -> None:
    """The two-phase schedule is the fast path's: a reference mixer decodes sequentially and
    refuses it, where the fast one of the same variant takes it by default."""
    assert build_model(make(variant)).mixer.inference_schedule == "two_phase"
    model = build_model(make(variant), mixer_impl="reference")
    assert model.mixer.schedules == ("sequential",)
    assert model.mixer.inference_schedule == "sequential"
    with pytest.raises(ValueError, match="schedule"):
        model.step(torch.zeros(1, 4, dtype=torch.long), model.new_cache(), "two_phase")


def test_online_queries_follow_the_parameters() -> None:
    """The online path reads the parameters as they are at each pass: an in-place update (an
    optimiser step), a loaded state, a replaced parameter and a change of dtype are all
    seen."""
    torch.manual_seed(0)
    model = build_model(make("block_attnres", block_size=2, n_layers=3)).eval()
    idx = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    mixer = model.mixer
    assert isinstance(mixer, BlockAttnRes)

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
    """Decoding leaves nothing in the model: a deep copy and a saved model decode the same as
    the original."""
    model = build_model(make("block_attnres", block_size=2)).eval()
    perturb(model.mixer, 1.0)
    idx = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(3))
    first = model.step(idx, model.new_cache())
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        torch.testing.assert_close(other.step(idx, other.new_cache()), first)
