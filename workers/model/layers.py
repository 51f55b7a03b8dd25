"""The pieces of a decoder-only Transformer: norms, rotary positions, causal self-attention
with an optional KV cache, and the MLP. Each module takes the `ArchConfig` and reads only the
fields it needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from cost_model import ArchConfig

#: Norm epsilon. With zero-initialised depth queries every AttnRes sublayer input starts as the
#: mean of its sources, whose mean square falls to ~1e-6 at 32 sublayers (REFERENCE §1); a
#: usual 1e-5 would then dominate the data. 1e-10 is negligible there and still keeps a zero
#: vector finite. Norms compute in fp32, so the epsilon is representable.
NORM_EPS = 1e-10


def upcast(x: torch.Tensor) -> torch.Tensor:
    """16-bit tensors to fp32 for reductions and exponentials; fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def rms_normalize(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """x / rms(x) over the last dimension, computed in fp32, returned in x's dtype."""
    eps = NORM_EPS if eps is None else eps
    xf = upcast(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: x / rms(x) · g, with a learned gain g (d parameters)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x) * self.weight


def make_norm(cfg: ArchConfig) -> nn.Module:
    """RMSNorm (gain only) or LayerNorm (gain, plus a bias when cfg.bias)."""
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=NORM_EPS, bias=cfg.bias)
    return RMSNorm(cfg.d_model)


def rope_tables(
    head_dim: int, max_len: int, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Su et al. 2021 rotary tables: cos and sin of shape (max_len, head_dim/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1, x2) of the two halves of the head dimension. x: (B, T, H, Dh).

    Applied before the heads are moved forward, so the rotated tensors (and with them the
    attention output) keep the (B, T, H, Dh) layout and the output projection reads the
    attention output without a copy."""
    x1, x2 = upcast(x).chunk(2, dim=-1)
    cos, sin = cos[None, :, None], sin[None, :, None]  # (1, T, 1, Dh/2)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


@dataclass
class KVCache:
    """Keys and values of every block for incremental decoding; `pos` tokens are cached.

    Per block one buffer for the keys and one for the values, (B, H_kv, capacity, Dh), written
    in place and grown by doubling (up to the model's context): appending a token costs the
    token, not a copy of the whole cache as a concatenation per step would."""

    k: list[torch.Tensor | None] = field(default_factory=list)
    v: list[torch.Tensor | None] = field(default_factory=list)
    pos: int = 0
    limit: int | None = None  # the model's context, the largest capacity worth allocating

    @classmethod
    def empty(cls, n_layers: int, limit: int | None = None) -> KVCache:
        return cls([None] * n_layers, [None] * n_layers, 0, limit)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' keys and values (B, H_kv, T, Dh) at `pos`; returns every
        cached key and value so far (views of the buffers)."""
        start = self.pos
        end = start + k.shape[2]
        K, V = self.k[layer], self.v[layer]
        if K is None or V is None or K.shape[2] < end:
            capacity = max(end, 2 * K.shape[2] if K is not None else end)
            if self.limit is not None:
                capacity = max(end, min(capacity, self.limit))
            B, H, _, Dh = k.shape
            grown_k = k.new_empty(B, H, capacity, Dh)
            grown_v = v.new_empty(B, H, capacity, v.shape[-1])
            if K is not None and V is not None and start:
                grown_k[:, :, :start] = K[:, :, :start]
                grown_v[:, :, :start] = V[:, :, :start]
            self.k[layer], self.v[layer] = K, V = grown_k, grown_v
        K[:, :, start:end] = k
        V[:, :, start:end] = v
        return K[:, :, :end], V[:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention.

    `attn_impl="sdpa"` uses PyTorch's scaled_dot_product_attention; `"math"` writes the same
    computation as explicit matrix products (used to compare FLOPs with a FLOP counter, which
    has no formula for the CPU SDPA kernel)."""

    def __init__(self, cfg: ArchConfig, attn_impl: str = "sdpa") -> None:
        super().__init__()
        if attn_impl not in ("sdpa", "math"):
            raise ValueError(f"attn_impl: unknown value {attn_impl!r}; expected sdpa or math")
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.k = nn.Linear(cfg.d_model, cfg.kv_dim, bias=cfg.bias)
        self.v = nn.Linear(cfg.d_model, cfg.kv_dim, bias=cfg.bias)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.attn_impl = attn_impl

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, Dh)
        k = self.k(x).view(B, T, self.kv_heads, self.head_dim)  # (B, T, Hkv, Dh)
        v = self.v(x).view(B, T, self.kv_heads, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, Dh)
        past = 0
        if cache is not None:
            past = cache.pos
            k, v = cache.append(layer, k, v)
        y = self._attend(q, k, v, past)  # (B, H, T, Dh)
        out: torch.Tensor = self.o(y.transpose(1, 2).reshape(B, T, C))
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
        T, S = q.shape[2], k.shape[2]
        gqa = self.kv_heads != self.n_heads
        mask = None
        if past and T > 1:  # a chunk after cached tokens: query t sees keys ≤ past + t
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past)
        if self.attn_impl == "sdpa":
            if mask is None:
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=T > 1 and past == 0, enable_gqa=gqa
                )
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        if gqa:
            repeat = self.n_heads // self.kv_heads
            k = k.repeat_interleave(repeat, dim=1)  # (B, H, S, Dh)
            v = v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5  # (B, H, T, S)
        if T > 1:
            if mask is None:
                mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
            scores = scores.masked_fill(~mask, float("-inf"))
        out: torch.Tensor = scores.softmax(dim=-1).to(v.dtype) @ v
        return out


class MLP(nn.Module):
    """GELU: down(gelu(up x)). SwiGLU (Shazeer 2020): down(silu(gate x) · up x)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias) if self.swiglu else None
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.gate(x)) * self.up(x) if self.gate is not None else F.gelu(self.up(x))
        out: torch.Tensor = self.down(hidden)
        return out


class TransformerBlock(nn.Module):
    """The two sublayers of one Transformer block, each with its own PreNorm. The residual
    wiring between them is not here: it is the model's `DepthMixer`."""

    def __init__(self, cfg: ArchConfig, attn_impl: str = "sdpa") -> None:
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, attn_impl)
        self.mlp_norm = make_norm(cfg)
        self.mlp = MLP(cfg)
