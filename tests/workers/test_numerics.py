"""Numerical details of the model that no broader test pins: the training loss computed in
the model's own precision (fp64 stays fp64, 16-bit is upcast to fp32), and inference that
gives a sequence the same bits at any row of a batch."""

from __future__ import annotations

import pytest
import torch

from workers.model import DepthscopeLM, build_model, depth_attention

from .support import make, perturb


def _reference_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in fp64, written out: logsumexp(z) − z_target per position."""
    z = logits.double().reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    shift = z.max(dim=-1, keepdim=True).values
    lse = (z - shift).exp().sum(-1).log() + shift.squeeze(-1)
    return (lse - z[torch.arange(len(t)), t]).mean()


@pytest.mark.parametrize("variant", ["baseline", "block_attnres"])
def test_an_fp64_model_s_loss_is_computed_in_fp64(variant: str) -> None:
    model = build_model(make(variant, n_layers=2)).double()
    perturb(model, 0.5)  # logits far from uniform: an fp32 loss is off by ~1e-7
    idx = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(1))
    logits, loss = model(idx, idx.roll(-1, 1))
    assert loss is not None and loss.dtype == torch.float64
    expected = _reference_loss(logits, idx.roll(-1, 1))
    assert abs(loss.item() - expected.item()) <= 1e-12 * abs(expected.item())


def test_a_16_bit_model_s_loss_is_computed_in_fp32() -> None:
    model = build_model(make("baseline", n_layers=2)).to(torch.bfloat16)
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, idx.roll(-1, 1))
    assert logits.dtype == torch.bfloat16
    assert loss is not None and loss.dtype == torch.float32
    expected = _reference_loss(logits.float(), idx.roll(-1, 1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


# -- row invariance of inference ----------------------------------------------------------------
#: (variant, block_size): Full AttnRes (S = 1) and Block AttnRes with an uneven last block.
TWO_PHASE = [("full_attnres", None), ("block_attnres", 3), ("block_attnres", 2)]


def _at_rows(
    model: DepthscopeLM, seq: torch.Tensor, others: torch.Tensor, schedule: str, prefill: int
) -> list[torch.Tensor]:
    """`seq` (1, T) at each row of a batch of the `others`: its logits, a prefill of `prefill`
    tokens then one decoding step per token."""
    out = []
    for row in range(len(others) + 1):
        batch = torch.cat([others[:row], seq, others[row:]])
        cache = model.new_cache()
        logits = [model.step(batch[:, :prefill], cache, schedule)]
        for t in range(prefill, batch.shape[1]):
            logits.append(model.step(batch[:, t : t + 1], cache, schedule))
        out.append(torch.cat(logits, dim=1)[row])
    return out


@pytest.mark.parametrize(
    ("schedule", "per_block"),
    [("two_phase", False), ("two_phase", True), ("sequential", False)],
    ids=["two-phase-online", "two-phase-per-block", "sequential"],
)
@pytest.mark.parametrize(("variant", "block_size"), TWO_PHASE)
@pytest.mark.parametrize(("batch", "prefill"), [(3, 7), (5, 13), (6, 15)])
def test_inference_gives_a_sequence_the_same_logits_at_any_row(
    variant: str,
    block_size: int | None,
    batch: int,
    prefill: int,
    schedule: str,
    per_block: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fp32, one thread: a sequence's logits are the same bits wherever it sits in a batch,
    in prefill and in decoding, under both schedules (two-phase online and per block), as in
    the training forward. Odd batch and prefill sizes put
    its elements at every offset of a vector register (a kernel's scalar tail rounds
    otherwise)."""
    if per_block:
        monkeypatch.setattr(depth_attention, "ONLINE_LIMIT", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several threads split small products by position
    try:
        kw = {"block_size": block_size} if block_size else {}
        model = build_model(make(variant, n_layers=6, **kw)).eval()
        assert model.mixer.inference_schedule == "two_phase"
        perturb(model.mixer, 1.0, seed=1)  # queries far from uniform
        gen = torch.Generator().manual_seed(batch * prefill)
        seq = torch.randint(0, 256, (1, 20), generator=gen)
        others = torch.randint(0, 256, (batch - 1, 20), generator=gen)
        rows = _at_rows(model, seq, others, schedule, prefill)
        for row, logits in enumerate(rows):
            assert torch.equal(logits, rows[0]), (row, (logits - rows[0]).abs().max().item())
        with torch.no_grad():  # and the training forward's, to the schedules' tolerance
            forward = model(seq)[0][0]
        torch.testing.assert_close(rows[0], forward, rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(threads)
