"""Attention Residuals (Kimi Team 2026): Full AttnRes, its ablations (the paper's Table 4) and
Block AttnRes, with the two-phase schedule of both.

Per sublayer l a pseudo-query w_l ∈ R^d and the gain g_l of an RMSNorm on the keys; the input
of sublayer l is a softmax over depth of its sources, h_l = Σ_i α_i·v_i with
α = softmax_i(w_lᵀ(g_l ⊙ RMSNorm(v_i))); no 1/√d, no temperature. The output aggregation is
one more query/gain pair over the embedding and every block. Full AttnRes: every sublayer
output is a source (S = 1). Block AttnRes: the embedding, the finished blocks (sums of S
outputs) and the running partial sum of the current block.

Fast path: static queries (every variant but `attnres_input_query`) run on a depth stack
(`depth_stack.DepthStack`: every logit of a source computed when it is made, one batched
product per use); the input-dependent query on per-use `depth_attention.depth_attend`;
inference (and, on request, training) of the static softmax variants on the two-phase
schedule (`_two_phase`: `block_phase1`, `merge_partial`, `OnlineDepth`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cost_model import ArchConfig
from workers.model.depth_attention import (
    OnlineDepth,
    ScaledQueries,
    block_phase1,
    depth_attend,
    merge_partial,
    rms_scale,
)
from workers.model.depth_stack import DepthStack
from workers.model.layers import rms_normalize
from workers.model.mixers.base import DepthMixer, Impl, Sublayer

Part = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # (w_l, W_l, g_l)


class AttnRes(DepthMixer):
    """What Full and Block AttnRes share: parameters, initialisation, the reference forward
    (over blocks of `block_size` sublayers, 1 for Full) and the two-phase schedule.

    Ablations (Full AttnRes only): `attnres_no_key_norm` (keys = raw sources, no gains),
    `attnres_sigmoid` (σ instead of softmax), `attnres_input_query` (q_l = w_l + W_l·n_last,
    W_l ∈ R^{d×d}, projecting the newest source's normalised state)."""

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__(cfg, impl)
        d, sub = cfg.d_model, cfg.n_sublayers
        self.key_norm = cfg.variant != "attnres_no_key_norm"
        self.gate = "sigmoid" if cfg.variant == "attnres_sigmoid" else "softmax"
        self.block_size = 1  # Full AttnRes: every sublayer's output is a source of its own
        self.queries = nn.Parameter(torch.empty(sub, d))
        self.agg_query = nn.Parameter(torch.empty(d))
        self.key_gains = nn.Parameter(torch.empty(sub, d)) if self.key_norm else None
        self.agg_key_gain = nn.Parameter(torch.empty(d)) if self.key_norm else None
        self.input_proj = (
            nn.Parameter(torch.empty(sub, d, d)) if cfg.variant == "attnres_input_query" else None
        )
        static_softmax = self.input_proj is None and self.gate == "softmax" and self.key_norm
        if impl == "fast" and static_softmax:
            # Training keeps the plain sequential path (measured faster in a whole training
            # step on a CPU); the two-phase schedule, also differentiable and tested equal,
            # serves inference.
            self.schedules = ("sequential", "two_phase")
            self.inference_schedule = "two_phase"
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Pseudo-queries w_l and the aggregation's 0 (every input starts as the plain mean of
        its sources), key-norm gains 1, input-dependent query projections W_l 0."""
        self.queries.zero_()
        self.agg_query.zero_()
        for gain in (self.key_gains, self.agg_key_gain):
            if gain is not None:
                gain.fill_(1.0)
        if self.input_proj is not None:
            self.input_proj.zero_()

    def depth_mixing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Every parameter of the mixer: the pseudo-queries w_l (`queries`, L×d) and the
        aggregation's (`agg_query`, d); the key-norm gains g_l (`key_gains`, L×d) and the
        aggregation's (`agg_key_gain`, d), absent in `attnres_no_key_norm`; the
        input-dependent query projections W_l (`input_proj`, L×d×d, `attnres_input_query`
        only)."""
        named = {
            "queries": self.queries,
            "agg_query": self.agg_query,
            "key_gains": self.key_gains,
            "agg_key_gain": self.agg_key_gain,
            "input_proj": self.input_proj,
        }
        return [(name, p) for name, p in named.items() if p is not None]

    # -- reference -------------------------------------------------------------------------
    def reference(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        """REFERENCE.md §1: the sources of sublayer l are the embedding b_0, the finished
        blocks b_1 … b_n and, inside a block, the partial sum of its outputs so far (a zero
        partial is no source); a block is the sum of its S outputs."""
        S, L = self.block_size, self.n_sublayers
        blocks, partial = [emb], None
        for l in range(L):
            sources = blocks if partial is None else [*blocks, partial]
            out = sublayer(l, self.attend_reference(l, sources)).to(emb.dtype)
            partial = out if partial is None else partial + out
            if (l + 1) % S == 0 or l + 1 == L:  # block complete
                blocks.append(partial)
                partial = None
        return self.attend_reference(L, blocks)  # the aggregation

    def attend_reference(self, use: int, sources: list[torch.Tensor]) -> torch.Tensor:
        """Use `use` (a sublayer, or L: the aggregation) over its sources: the gate over
        qᵀ(g ⊙ RMSNorm(v_i)), raw keys v_i without key norm."""
        V = torch.stack(sources)  # (k, B, T, d)
        if use < self.n_sublayers:
            q = self.queries[use]
            gain = None if self.key_gains is None else self.key_gains[use]
            if self.input_proj is not None:
                newest = rms_normalize(sources[-1]) if self.key_norm else sources[-1]
                q = q + newest @ self.input_proj[use].T  # (B, T, d)
        else:
            q, gain = self.agg_query, self.agg_key_gain
        K = V if gain is None else rms_normalize(V) * gain
        logits = (K * q).sum(-1)  # (k, B, T)
        weights = logits.sigmoid() if self.gate == "sigmoid" else logits.softmax(0)
        return (weights[..., None] * V).sum(0)

    # -- fast path: pieces -----------------------------------------------------------------
    def key(self, v: torch.Tensor) -> torch.Tensor | None:
        """The source's key scale 1/rms (None when the raw sources are the keys): the key
        r·v is never materialised (see `depth_attention`)."""
        return rms_scale(v) if self.key_norm else None

    def split(self) -> list[Part]:
        """Per sublayer (pseudo-query, input projection, key gain), split once per forward: the
        gradients of one `unbind` are stacked in one go, where indexing a slice per sublayer
        would zero-fill a gradient of the whole tensor for each."""
        sub = self.n_sublayers
        none: list[torch.Tensor | None] = [None] * sub
        projs = list(self.input_proj.unbind(0)) if self.input_proj is not None else none
        gains = list(self.key_gains.unbind(0)) if self.key_gains is not None else none
        return list(zip(self.queries.unbind(0), projs, gains, strict=True))

    def query(self, part: Part, newest: torch.Tensor | None = None) -> torch.Tensor:
        """A sublayer's query from its `split` part; with the input projection, from the
        newest source too."""
        q, proj, gain = part
        if proj is not None and newest is not None:
            state = rms_normalize(newest) if self.key_norm else newest
            q = q + state @ proj.T  # (B, T, d)
        if gain is not None:
            q = q * gain
        return q

    def _scales(self, keys: Sequence[torch.Tensor | None]) -> list[torch.Tensor] | None:
        return [k for k in keys if k is not None] if self.key_norm else None

    def aggregate(
        self, values: list[torch.Tensor], keys: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        q = self.agg_query if self.agg_key_gain is None else self.agg_query * self.agg_key_gain
        return depth_attend(q, values, self._scales(keys), self.gate)

    def attend(
        self, part: Part, values: list[torch.Tensor], keys: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        q = self.query(part, values[-1])
        return depth_attend(q, values, self._scales(keys), self.gate)

    def static_queries(self) -> torch.Tensor:
        """(U, d): every use's query, the aggregation last, key gains folded in."""
        queries = torch.cat([self.queries, self.agg_query[None]])
        if self.key_gains is not None and self.agg_key_gain is not None:
            queries = queries * torch.cat([self.key_gains, self.agg_key_gain[None]])
        return queries

    def stack(self, emb: torch.Tensor, slots: int) -> DepthStack:
        """Static queries (every variant but the input-dependent query): the sources go on a
        `DepthStack` that serves every use, the aggregation last."""
        return DepthStack(self.static_queries(), emb, slots, self.key_norm, self.gate)

    def blocks(self) -> list[range]:
        S, L = self.block_size, self.n_sublayers
        return [range(s, min(s + S, L)) for s in range(0, L, S)]

    # -- fast path: the two-phase schedule -------------------------------------------------
    def run(
        self, emb: torch.Tensor, sublayer: Sublayer, schedule: str = "sequential"
    ) -> torch.Tensor:
        if schedule != "two_phase" or schedule not in self.schedules:
            return super().run(emb, sublayer, schedule)  # (which refuses it)
        return self._two_phase(emb, sublayer)

    def _two_phase(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        """Attention Residuals §4, Algorithm 1 (with the pre-update partial in the merge).

        Phase 1: the pseudo-queries of a block do not depend on the input, so all of them
        attend to the finished blocks in one batched pass, keeping per query the normalised
        result h¹ and its log-sum-exp ℓ¹ (`block_phase1`). Phase 2: walk the block; the only new
        source of its i-th sublayer (i ≥ 2) is the partial b_n^{i−1}, merged online:
        h = h¹ + σ(s − ℓ¹)·(b − h¹) with s = qᵀRMSNorm(b) (`merge_partial`) — the same as
        m = max(m¹, s), h = (e^{m¹−m}·o¹ + e^{s−m}·b)/(e^{m¹−m}·ℓ¹ + e^{s−m}). Exact, not an
        approximation: it equals the joint softmax, and it is differentiable, so it serves
        training as well as prefill and decoding. Softmax with static queries only (`run`
        refuses it to the ablations).

        Full AttnRes is the case S = 1 (no partials): there only the online form differs from
        the sequential path; per-block Phase 1 would stack every source again for each
        sublayer, so above `ONLINE_LIMIT` (or with gradients) the depth stack serves it."""
        if not torch.is_grad_enabled() and OnlineDepth.fits(self.n_sublayers + 1, emb):
            return self._two_phase_online(emb, sublayer)
        if self.block_size == 1:
            return super().run(emb, sublayer, "sequential")
        values, keys = [emb], [rms_scale(emb)]
        all_queries = self.queries if self.key_gains is None else self.queries * self.key_gains
        for block in self.blocks():
            queries = all_queries[block.start : block.stop]  # (S, d)
            h1, lse1 = block_phase1(queries, values, keys)  # S × (B, T, d), S × (B, T)
            partial: torch.Tensor | None = None
            for i, l in enumerate(block):
                h = h1[i]
                if partial is not None:
                    h = merge_partial(h, lse1[i], partial, queries[i])
                out = sublayer(l, h.to(emb.dtype)).to(emb.dtype)
                partial = out if partial is None else partial + out
            assert partial is not None
            values.append(partial)
            keys.append(rms_scale(partial))
        return self.aggregate(values, keys)

    def _two_phase_online(self, emb: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        """The same schedule for decoding-sized inputs: Phase 1 of every later block is
        updated online as each block finishes (`OnlineDepth.push`, one batched update over all
        later pseudo-queries), Phase 2 merges the partial as above (`OnlineDepth.merged`)."""
        depth = OnlineDepth(ScaledQueries(self.static_queries()), emb)
        L = self.n_sublayers
        partial: torch.Tensor | None = None
        for block in self.blocks():
            partial = None
            for l in block:
                h = depth.input(l) if partial is None else depth.merged(l, partial)
                out = sublayer(l, h).to(emb.dtype)
                partial = out if partial is None else partial + out
            assert partial is not None
            if block.stop < L:
                depth.push(partial, block.stop)
        assert partial is not None
        return depth.merged(L, partial)  # the last block is the aggregation's last source


class FullAttnRes(AttnRes):
    """Full AttnRes: sublayer l attends to v_0 (the embedding) and every earlier output."""

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        if self.input_proj is None:
            return {"stack": self.stack(emb, self.n_sublayers + 1)}
        return {"values": [emb], "keys": [self.key(emb)], "split": self.split()}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        if "stack" in state:
            h: torch.Tensor = state["stack"].attend(l)
            return h
        return self.attend(state["split"][l], state["values"], state["keys"])

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        if "stack" in state:
            state["stack"].push(out)
            return
        state["values"].append(out)
        state["keys"].append(self.key(out))

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        if "stack" in state:
            h: torch.Tensor = state["stack"].attend(self.n_sublayers)
            return h
        return self.aggregate(state["values"], state["keys"])


class BlockAttnRes(AttnRes):
    """Block AttnRes with S sublayers per block (the last block may be shorter).

    Sources of the i-th sublayer (1-based) of block n: the embedding b_0 (never folded into a
    block), the finished blocks b_1 … b_n, and for i ≥ 2 the running partial sum b_n^{i−1}
    (b_n^0 = 0 is never a source). A block's representation is the sum of its outputs.
    """

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__(cfg, impl)
        assert cfg.block_size is not None
        self.block_size = cfg.block_size

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        stack = self.stack(emb, len(self.blocks()) + 1)
        return {"stack": stack, "partial": None, "partial_key": None}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        if state["partial"] is not None and state["partial_key"] is None:
            state["partial_key"] = self.key(state["partial"])
        h: torch.Tensor = state["stack"].attend(l, state["partial"], state["partial_key"])
        return h

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        partial = out if state["partial"] is None else state["partial"] + out
        state["partial"], state["partial_key"] = partial, None
        if (l + 1) % self.block_size == 0 or l + 1 == self.n_sublayers:  # block complete
            state["stack"].push(partial)
            state["partial"] = None

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        h: torch.Tensor = state["stack"].attend(self.n_sublayers)
        return h
