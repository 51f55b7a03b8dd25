"""What the model tests share: small configurations, perturbed parameters, driving a mixer with
fixed sublayer outputs, the paper's source sets, both inference schedules, the fp64
equality of values and gradients, and a corpus that keeps the training batches it hands out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cost_model import ArchConfig
from workers.data import Corpus
from workers.model import DepthMixer, DepthscopeLM, build_model

SHAPES: list[dict[str, Any]] = [  # keyword arguments of ArchConfig
    {},
    {"mlp": "swiglu", "norm": "layernorm", "positions": "learned", "bias": True},
    {"n_kv_heads": 2, "tie_embeddings": False, "vocab_size": 97},
    {"n_layers": 5, "d_model": 96, "n_heads": 6, "d_ff": 200},
]


def make(variant: str, block_size: int | None = 3, **kw: object) -> ArchConfig:
    base: dict[str, object] = {"n_layers": 3, "d_model": 64, "n_heads": 4, "seq_len": 32}
    base.update(kw)
    return ArchConfig(
        variant=variant,  # type: ignore[arg-type]
        block_size=block_size if variant == "block_attnres" else None,
        **base,  # type: ignore[arg-type]
    )


def perturb(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """Move every parameter off its initial value (zero-init queries make many paths trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def drive(
    mixer: DepthMixer, emb: torch.Tensor, outs: list[torch.Tensor], finish: bool = False
) -> list[torch.Tensor]:
    """Run a mixer (either implementation) whose sublayer l returns the fixed `outs[l]`;
    return every sublayer input (and, with `finish`, the mixer's output last)."""
    inputs: list[torch.Tensor] = []

    def sublayer(l: int, h: torch.Tensor) -> torch.Tensor:
        inputs.append(h)
        return outs[l]

    out = mixer.run(emb, sublayer)
    return [*inputs, out] if finish else inputs


def paper_sources(
    variant: str, block_size: int, emb: torch.Tensor, outs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The sources of the next sublayer after `outs`, straight from REFERENCE.md §1."""
    if variant != "block_attnres":
        return [emb, *outs]
    l = len(outs)  # index of the next sublayer
    n = l // block_size  # the next sublayer is in block n (0-based)
    blocks = [tensor_sum(outs[b * block_size : (b + 1) * block_size]) for b in range(n)]
    partial = outs[n * block_size : l]
    # a zero partial is no source
    return [emb, *blocks] + ([tensor_sum(partial)] if partial else [])


def tensor_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`sum` of a non-empty list of tensors (the built-in's start is 0, hence its type)."""
    total = sum(tensors)
    assert isinstance(total, torch.Tensor)
    return total


def fp64_mixer_and_sources(
    cfg: ArchConfig, tokens: int, seed: int
) -> tuple[DepthMixer, torch.Tensor, list[torch.Tensor]]:
    """A float64 mixer (the fast path) with every parameter moved well off its initial value,
    and a random embedding and sublayer outputs (2 sequences of `tokens`) that require
    gradients."""
    mixer = build_model(cfg).double().mixer
    perturb(mixer, 0.5, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    shape = (2, tokens, cfg.d_model)
    emb, *outs = (
        torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)
        for _ in range(cfg.n_sublayers + 1)
    )
    return mixer, emb, outs


def reference_twin(mixer: DepthMixer, cfg: ArchConfig) -> DepthMixer:
    """The reference implementation of `mixer`'s variant holding the very same parameters."""
    twin = build_model(cfg, mixer_impl="reference").double().mixer
    assert twin.impl == "reference"
    twin.load_state_dict(mixer.state_dict())
    return twin


def assert_same_with_gradients(
    ours: list[torch.Tensor],
    ref: list[torch.Tensor],
    wanted: list[torch.Tensor],
    ref_wanted: list[torch.Tensor] | None = None,
) -> None:
    """Equal values (1e-12) and equal gradients of `wanted` (1e-10) through a probe that
    weighs every result differently; `ref_wanted`: the reference's own tensors in the same
    order (its parameters, when it is a twin), else `wanted`."""

    def through(results: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        probe = sum((h.sin() * (i + 1)).sum() for i, h in enumerate(results))
        assert isinstance(probe, torch.Tensor)
        return list(torch.autograd.grad(probe, inputs))

    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    grads = zip(through(ours, wanted), through(ref, ref_wanted or wanted), strict=True)
    for a, b in grads:
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def run_schedules(model: DepthscopeLM, idx: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
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


@dataclass(frozen=True, eq=False)
class RecordingCorpus(Corpus):
    """A real corpus (the same tokens) that also keeps a copy of every training batch it
    hands out, in order (`drawn`): what a training run actually trained on."""

    drawn: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def of(cls, corpus: Corpus) -> RecordingCorpus:
        return cls(corpus.train, corpus.val, corpus.info)

    def batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().batch(split, batch_size, seq_len, generator)
        if split == "train":
            self.drawn.append((x.clone(), y.clone()))
        return x, y
