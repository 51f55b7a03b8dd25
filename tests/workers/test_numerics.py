"""Numerical details of the model and the trainer that no broader test pins: the training
loss computed in the model's own precision (fp64 stays fp64, 16-bit is upcast to fp32)."""

from __future__ import annotations

import pytest
import torch

from workers.model import build_model

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
