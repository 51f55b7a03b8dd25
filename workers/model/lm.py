"""The decoder-only language model: embedding, one loop over sublayers whose residual wiring
is a `DepthMixer`, final norm, LM head."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from cost_model import ArchConfig
from workers.model.layers import (
    KVCache,
    RMSNorm,
    TransformerBlock,
    make_norm,
    rope_tables,
    upcast,
)
from workers.model.mixers import DepthMixer, Impl, make_mixer

INIT_STD = 0.02  # GPT-2's initialisation scale


class DepthscopeLM(nn.Module):
    """A decoder-only Transformer built from an `ArchConfig`.

    `forward(idx, targets)` is the training path (whole sequences, causal attention).
    `step(idx, cache, schedule)` is the inference path: a prefill (many tokens) or a decode
    step (one token) against a `KVCache`, with the depth schedule `"sequential"` or, for Block
    AttnRes, `"two_phase"`. `mixer_impl` picks the residual wiring's fast path (the default)
    or its reference forward (`workers.model.mixers`).
    """

    rope_cos: torch.Tensor  # (T, Dh / 2) buffers, with RoPE only
    rope_sin: torch.Tensor

    def __init__(self, cfg: ArchConfig, attn_impl: str = "sdpa", mixer_impl: Impl = "fast") -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = (
            nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.positions == "learned" else None
        )
        self.blocks = nn.ModuleList(TransformerBlock(cfg, attn_impl) for _ in range(cfg.n_layers))
        with _forked_rng(()):  # the mixer's construction draws nothing from the shared stream
            self.mixer: DepthMixer = make_mixer(cfg, mixer_impl)
        self.norm_f = make_norm(cfg)
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        )
        if cfg.positions == "rope":
            cos, sin = rope_tables(cfg.head_dim, cfg.seq_len)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every tensor's initial distribution, in one place:

        - token embedding, learned positions, every Linear weight (and an untied LM head):
          N(0, 0.02); the two output projections of each block (attention `o`, MLP `down`):
          N(0, 0.02/√(2·L_b)) (GPT-2's residual scaling); biases 0; norm gains 1.
        - the residual wiring: its mixer's own `reset_parameters` (see each variant's module
          in `workers.model.mixers`): AttnRes pseudo-queries 0 (every sublayer input starts
          as the plain mean of its sources), key-norm gains 1, input-dependent query
          projections 0; mHC-lite projections 0, gates 0.01, biases H_pre = 1/n, H_post = 1,
          identity permutation logit 0 and the others −8; DenseFormer identity weights (1 on
          the newest block output, 0 elsewhere).

        Paired seeds: the Transformer's parameters are drawn first, in module order, from the
        global generator; the mixer is built and initialised under a fork of it (its
        construction and any draw of its `reset_parameters` leave the global stream as it
        was). So under one `torch.manual_seed`, two variants of the same shape get the same
        initial value for every common parameter (embedding, blocks, final norm, head),
        whatever their mixers draw.
        """
        out_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        mixer_modules = set(self.mixer.modules())
        for name, module in self.named_modules():
            if module in mixer_modules:
                continue  # the mixer initialises its own (below)
            if isinstance(module, nn.Linear):
                std = out_std if name.endswith((".o", ".down")) else INIT_STD
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, INIT_STD)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (RMSNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
        with _forked_rng(p.device for p in self.mixer.parameters()):
            self.mixer.reset_parameters()

    def depth_mixing_parameter_names(self) -> list[str]:
        """The names (as in `named_parameters()`) of the residual wiring's parameters, the
        mixer's `depth_mixing_parameters`: the optimizer's `depth_mixing` group."""
        return [f"mixer.{name}" for name, _ in self.mixer.depth_mixing_parameters()]

    # -- pieces ----------------------------------------------------------------------------
    def _embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        _, T = idx.shape
        if start + T > self.cfg.seq_len:
            raise ValueError(
                f"seq_len: positions {start}..{start + T - 1} exceed the model's {self.cfg.seq_len}"
            )
        x: torch.Tensor = self.tok_emb(idx)  # (B, T, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device))
        return x

    def _rope(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.cfg.positions != "rope":
            return None
        return self.rope_cos[start : start + length], self.rope_sin[start : start + length]

    def _sublayer(
        self,
        l: int,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None,
    ) -> torch.Tensor:
        """f_l(h): sublayer l = attention (even l) or MLP (odd l) of block l // 2, PreNorm."""
        block = cast(TransformerBlock, self.blocks[l // 2])
        out: torch.Tensor
        if l % 2 == 0:
            out = block.attn(block.attn_norm(h), rope, cache, l // 2)
        else:
            out = block.mlp(block.mlp_norm(h))
        return out

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm_f(h)
        if self.lm_head is not None:
            logits: torch.Tensor = self.lm_head(h)
            return logits
        return h @ self.tok_emb.weight.T.to(h.dtype)

    # -- paths -----------------------------------------------------------------------------
    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        schedule: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Training path: logits (B, T, V) and, with targets, the mean cross-entropy (fp32 for a
        16-bit model, else in the model's precision: fp64 stays fp64).
        `schedule` picks the depth schedule (default: the mixer's own)."""
        x = self._embed(idx)
        rope = self._rope(0, idx.shape[1])
        schedule = schedule or self.mixer.train_schedule
        h = self.mixer.run(x, lambda l, hl: self._sublayer(l, hl, rope, None), schedule)
        logits = self._logits(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(upcast(logits).view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.inference_mode()
    def step(self, idx: torch.Tensor, cache: KVCache, schedule: str | None = None) -> torch.Tensor:
        """Inference: run `idx` (B, T) after the `cache.pos` cached tokens; returns logits of
        every new position and advances the cache. `schedule`: default the mixer's own.
        Inference mode, not just no-grad: no view or version tracking on any operation, which
        a decoding step (bound by the number of operations) feels; the cache and the logits
        are inference tensors, not for autograd."""
        schedule = schedule or self.mixer.inference_schedule
        start, T = cache.pos, idx.shape[1]
        x = self._embed(idx, start)
        rope = self._rope(start, T)
        h = self.mixer.run(x, lambda l, hl: self._sublayer(l, hl, rope, cache), schedule)
        cache.pos = start + T
        return self._logits(h)

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.cfg.n_layers, self.cfg.seq_len)


@contextmanager
def _forked_rng(devices: Iterator[torch.device] | tuple[torch.device, ...]) -> Iterator[None]:
    """Run the body on a copy of the global CPU generator (and of the CUDA generators of
    `devices`), restored afterwards: draws inside do not move the shared stream."""
    cuda = sorted({d.index or 0 for d in devices if d.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        yield


def build_model(
    cfg: ArchConfig, attn_impl: str = "sdpa", mixer_impl: Impl = "fast"
) -> DepthscopeLM:
    """The model for `cfg`, initialised (see `DepthscopeLM.reset_parameters`)."""
    return DepthscopeLM(cfg, attn_impl, mixer_impl)
