"""The fast path's depth arithmetic on its own: `depth_attend`'s inference and autograd paths
agree, and the depth stack (static-query AttnRes) keeps no state between passes, refuses
out-of-order uses, bounds its workspace and, with a source outside it, equals the definition."""

from __future__ import annotations

import pytest
import torch

from workers.model import build_model, depth_attend, rms_normalize
from workers.model.depth_attention import rms_scale

from .support import assert_same_with_gradients, make, perturb


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


@pytest.mark.parametrize("variant", ["full_attnres", "block_attnres"])
def test_depth_stacks_in_flight_together_and_kept_graphs(variant: str) -> None:
    """The stack's reused buffers never leak between forward passes: two forwards in flight at
    once (backward in the reverse order), a graph kept for a second backward, and a forward
    under no_grad in between all give the gradients of one forward and backward alone."""
    model = build_model(make(variant, n_layers=3)).double()
    perturb(model, 0.3)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, 256, (2, 16), generator=gen) for _ in range(2))

    def param_grads() -> list[torch.Tensor]:
        out = []
        for p in model.parameters():
            assert p.grad is not None
            out.append(p.grad.clone())
        return out

    def grads(idx: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        model(idx, idx.roll(-1, 1))[1].backward()
        return param_grads()

    alone_a, alone_b = grads(a), grads(b)
    model.zero_grad()
    loss_a = model(a, a.roll(-1, 1))[1]
    loss_b = model(b, b.roll(-1, 1))[1]
    with torch.no_grad():
        model(b)
    torch.autograd.backward(loss_b, retain_graph=True)
    got_b = param_grads()
    model.zero_grad()
    torch.autograd.backward(loss_a)
    got_a = param_grads()
    model.zero_grad()
    torch.autograd.backward(loss_b)  # the kept graph, a second time
    again_b = param_grads()
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
