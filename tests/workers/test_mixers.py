"""Every residual variant's fast path against its reference forward (`workers.model.mixers`):
values and gradients equal in fp64, for fixed sublayer outputs and through sublayers that
depend on their inputs; the mixers' own initialisation; mHC-lite's invariants."""

from __future__ import annotations

import pytest
import torch

from cost_model import VARIANTS
from workers.model import IMPLS, MIXERS, DepthMixer, MHCLite, build_model, make_mixer

from .support import (
    assert_same_with_gradients,
    drive,
    fp64_mixer_and_sources,
    make,
    perturb,
    reference_twin,
)

#: Every variant, Block AttnRes with several block sizes (uneven last blocks included)
CASES = [(v, None) for v in VARIANTS if v != "block_attnres"] + [
    ("block_attnres", s) for s in (1, 2, 3, 4, 10)
]


# -- the registry and the choice of implementation ---------------------------------------------
def test_every_variant_has_a_mixer_in_either_implementation() -> None:
    assert set(MIXERS) == set(VARIANTS)
    for variant in VARIANTS:
        for impl in IMPLS:
            mixer = make_mixer(make(variant), impl)  # type: ignore[arg-type]
            assert isinstance(mixer, MIXERS[variant]) and mixer.impl == impl
    with pytest.raises(ValueError, match="impl"):
        make_mixer(make("baseline"), "compiled")  # type: ignore[arg-type]


# -- the fast path equals the reference ---------------------------------------------------------
def run_recording(
    mixer: DepthMixer, emb: torch.Tensor, outs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Every sublayer input and the output of `mixer.run` with sublayers that depend on their
    input, f_l(h) = tanh(h)·(1 + outs[l]) + outs[l], so that every gradient also runs through
    the later sublayers' inputs."""
    inputs: list[torch.Tensor] = []

    def sublayer(l: int, h: torch.Tensor) -> torch.Tensor:
        inputs.append(h)
        return torch.tanh(h) * (1 + outs[l]) + outs[l]

    out = mixer.run(emb, sublayer)
    return [*inputs, out]


@pytest.mark.parametrize(("variant", "block_size"), CASES)
def test_fast_path_equals_the_reference_through_its_sublayers(
    variant: str, block_size: int | None
) -> None:
    """Every variant: the output of `run` and every sublayer input of the fast path equal the
    reference's, and so do the gradients of the embedding, of the sublayer outputs and of
    every mixer parameter (fp64; 1e-12 values, 1e-10 gradients)."""
    cfg = make(variant, block_size=block_size, n_layers=5, d_model=16, n_heads=2)
    mixer, emb, outs = fp64_mixer_and_sources(cfg, tokens=5, seed=4)
    twin = reference_twin(mixer, cfg)
    assert (mixer.impl, twin.impl) == ("fast", "reference")
    assert_same_with_gradients(
        run_recording(mixer, emb, outs),
        run_recording(twin, emb, outs),
        [emb, *outs, *mixer.parameters()],
        [emb, *outs, *twin.parameters()],
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_models_on_either_implementation_agree(variant: str) -> None:
    """A whole model (fp64) with its mixer's reference forward trains as with its fast path:
    the same loss and the same gradient of every parameter (1e-10)."""
    cfg = make(variant, n_layers=3, d_model=32, n_heads=2)
    fast = build_model(cfg).double()
    perturb(fast, 0.3)
    ref = build_model(cfg, mixer_impl="reference").double()
    ref.load_state_dict(fast.state_dict())
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    losses, grads = [], []
    for model in (fast, ref):
        _, loss = model(idx, idx.roll(-1, 1))
        assert loss is not None
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad for k, p in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert g is not None, name
        torch.testing.assert_close(g, grads[1][name], rtol=1e-10, atol=1e-10)


# -- initialisation ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_mixer_initialises_its_own_parameters(variant: str) -> None:
    """A mixer made alone starts as the model's does (the model delegates to it), and both its
    own `reset_parameters` and the model's bring a trained mixer back to that start."""
    cfg = make(variant)
    model = build_model(cfg)
    start = {k: v.clone() for k, v in model.mixer.state_dict().items()}
    alone: DepthMixer = make_mixer(cfg)
    assert alone.state_dict().keys() == start.keys()
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(value, start[name], rtol=0, atol=0)
    for reset in (model.mixer.reset_parameters, model.reset_parameters):
        perturb(model.mixer, 0.5)
        reset()
        for name, value in model.mixer.state_dict().items():
            torch.testing.assert_close(value, start[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("variant", "block_size"),
    [("full_attnres", None), ("attnres_sigmoid", None), ("attnres_no_key_norm", None)]
    + [("attnres_input_query", None)]
    + [("block_attnres", s) for s in (1, 2, 3, 4, 10)],
)
def test_depth_stack_equals_the_definition_with_gradients(
    variant: str, block_size: int | None
) -> None:
    """Every sublayer input, the aggregation, and the gradients of the embedding, of every
    sublayer output and of every parameter equal the plain-autograd definition (the mixer's
    reference forward; fp64, 1e-10), with queries and gains well off their initial values;
    uneven last blocks included."""
    cfg = make(variant, block_size=block_size, n_layers=5, d_model=16, n_heads=2)
    mixer, emb, outs = fp64_mixer_and_sources(cfg, tokens=5, seed=2)
    ours = drive(mixer, emb, outs, finish=True)
    twin = reference_twin(mixer, cfg)
    ref = drive(twin, emb, outs, finish=True)
    assert_same_with_gradients(
        ours, ref, [emb, *outs, *mixer.parameters()], [emb, *outs, *twin.parameters()]
    )


# -- mHC-lite -------------------------------------------------------------------------------
def test_mhc_lite_equals_its_definition_with_gradients() -> None:
    """The fused stream functions against the plain definition, fp64: every sublayer input,
    the output, and the gradients of the embedding, the sublayer outputs and every parameter
    (1e-10), with all parameters moved well off their initial values."""
    cfg = make("mhc_lite", n_layers=4, d_model=32, n_heads=2)
    mixer, emb, outs = fp64_mixer_and_sources(cfg, tokens=7, seed=3)
    ours = drive(mixer, emb, outs, finish=True)
    twin = reference_twin(mixer, cfg)
    ref = drive(twin, emb, outs, finish=True)
    assert_same_with_gradients(
        ours, ref, [emb, *outs, *mixer.parameters()], [emb, *outs, *twin.parameters()]
    )


def test_mhc_lite_initial_state_and_doubly_stochastic_mixing() -> None:
    """At initialisation the first input is the embedding (H_pre = 1/n on n copies) and
    H_post = 1; for any parameters H_res is doubly stochastic and H_post lies in [0, 2]."""
    model = build_model(make("mhc_lite"))
    mixer = model.mixer
    assert isinstance(mixer, MHCLite)
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
