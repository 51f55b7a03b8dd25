"""Residual wiring as strategies: one `DepthMixer` per variant, driven by the model's single
loop over sublayers.

The contract: `begin(emb)` makes the per-forward state from the token embedding;
`input(state, l)` is the input h_l of sublayer l (0-based, L = 2·L_b sublayers, attention
then MLP per block); `record(state, l, out)` takes the sublayer's output f_l(h_l);
`finish(state)` is the hidden state handed to the final norm. `run` drives the loop and may be
overridden by a schedule that reorders the work (AttnRes's two-phase inference). A mixer
holds parameters but no state between forward passes, so one model serves concurrent batches.
Sources are kept in the embedding's dtype (fp32 under autocast), as a residual stream is.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cost_model import ArchConfig
from workers.model import native, streams
from workers.model.depth_attention import (
    OnlineDepth,
    ScaledQueries,
    block_phase1,
    depth_attend,
    merge_partial,
    rms_scale,
    weighted_sum,
)
from workers.model.depth_stack import DepthStack
from workers.model.layers import rms_normalize
from workers.model.native import NativeDepth

Sublayer = Callable[[int, torch.Tensor], torch.Tensor]
Key = torch.Tensor | None  # a source's key scale 1/rms (B, T); None: the raw value is the key


class DepthMixer(nn.Module, ABC):
    """Base strategy: how sublayer inputs are gathered from earlier outputs."""

    schedules: tuple[str, ...] = ("sequential",)
    train_schedule = "sequential"  # what `forward` uses
    inference_schedule = "sequential"  # what `step` (prefill, decode) uses

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.n_sublayers = cfg.n_sublayers

    @abstractmethod
    def begin(self, emb: torch.Tensor) -> Any:
        """See the module docstring."""

    @abstractmethod
    def input(self, state: Any, l: int) -> torch.Tensor:
        """See the module docstring."""

    @abstractmethod
    def record(self, state: Any, l: int, out: torch.Tensor) -> None:
        """See the module docstring."""

    @abstractmethod
    def finish(self, state: Any) -> torch.Tensor:
        """See the module docstring."""

    def run(
        self, emb: torch.Tensor, sublayer: Sublayer, schedule: str = "sequential"
    ) -> torch.Tensor:
        if schedule not in self.schedules:
            supported = ", ".join(self.schedules)
            raise ValueError(
                f"schedule: {type(self).__name__} supports {supported}, not {schedule!r}"
            )
        state = self.begin(emb)
        for l in range(self.n_sublayers):
            out = sublayer(l, self.input(state, l))
            self.record(state, l, out.to(emb.dtype))
        return self.finish(state)


class StandardResidual(DepthMixer):
    """PreNorm residual: h_{l+1} = h_l + f_l(h_l)."""

    def begin(self, emb: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": emb}

    def input(self, state: dict[str, torch.Tensor], l: int) -> torch.Tensor:
        return state["h"]

    def record(self, state: dict[str, torch.Tensor], l: int, out: torch.Tensor) -> None:
        state["h"] = state["h"] + out

    def finish(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["h"]


class _AttnResBase(DepthMixer):
    """Shared parts of the AttnRes variants (Attention Residuals §3).

    Per sublayer l a pseudo-query w_l ∈ R^d (zero at init, so every input starts as the plain
    mean of its sources) and the gain g_l of an RMSNorm on the keys; no 1/√d, no temperature.
    Sources are normalised once (parameter-free) and the gain is folded into the query:
    w_lᵀ(g_l ⊙ n_i) = (w_l ⊙ g_l)ᵀ n_i. The output aggregation is one more query/gain pair over
    all sources. Ablations: `attnres_no_key_norm` (keys = raw sources, no gains),
    `attnres_sigmoid` (σ instead of softmax), `attnres_input_query` (q_l = w_l + W_l·n_{last},
    W_l ∈ R^{d×d} zero-initialised, projecting the newest source's normalised state).
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__(cfg)
        d, sub = cfg.d_model, cfg.n_sublayers
        self.key_norm = cfg.variant != "attnres_no_key_norm"
        self.gate = "sigmoid" if cfg.variant == "attnres_sigmoid" else "softmax"
        self.queries = nn.Parameter(torch.zeros(sub, d))
        self.agg_query = nn.Parameter(torch.zeros(d))
        self.key_gains = nn.Parameter(torch.ones(sub, d)) if self.key_norm else None
        self.agg_key_gain = nn.Parameter(torch.ones(d)) if self.key_norm else None
        self.input_proj = (
            nn.Parameter(torch.zeros(sub, d, d)) if cfg.variant == "attnres_input_query" else None
        )
        self._scaled: Any = None  # see `online`
        self.block_size = 1  # Full AttnRes: every sublayer's output is a source of its own
        if self.input_proj is None and self.gate == "softmax" and self.key_norm:
            # Training keeps the plain sequential path (measured faster in a whole training
            # step on a CPU); the two-phase schedule, also differentiable and tested equal,
            # serves inference.
            self.schedules = ("sequential", "two_phase")
            self.inference_schedule = "two_phase"

    def __getstate__(self) -> dict[str, Any]:
        # The scaled queries are derived per process (their plans hold the loaded kernels):
        # a copy or a pickle starts without them.
        return {**super().__getstate__(), "_scaled": None}

    def key(self, v: torch.Tensor) -> Key:
        """The source's key scale 1/rms (None when the raw sources are the keys): the key
        r·v is never materialised (see `depth_attention`)."""
        return rms_scale(v) if self.key_norm else None

    def split(self) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """Per sublayer (pseudo-query, input projection, key gain), split once per forward: the
        gradients of one `unbind` are stacked in one go, where indexing a slice per sublayer
        would zero-fill a gradient of the whole tensor for each."""
        sub = self.n_sublayers
        projs = self.input_proj.unbind(0) if self.input_proj is not None else [None] * sub
        gains = self.key_gains.unbind(0) if self.key_gains is not None else [None] * sub
        return list(zip(self.queries.unbind(0), projs, gains, strict=True))

    def query(
        self,
        part: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        newest: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A sublayer's query from its `split` part; with the input projection, from the
        newest source too."""
        q, proj, gain = part
        if proj is not None and newest is not None:
            state = rms_normalize(newest) if self.key_norm else newest
            q = q + state @ proj.T  # (B, T, d)
        if gain is not None:
            q = q * gain
        return q

    def _keys(self, keys: list[Key]) -> list[torch.Tensor] | None:
        return keys if self.key_norm else None  # type: ignore[return-value]

    def aggregate(self, values: list[torch.Tensor], keys: list[Key]) -> torch.Tensor:
        q = self.agg_query if self.agg_key_gain is None else self.agg_query * self.agg_key_gain
        return depth_attend(q, values, self._keys(keys), self.gate)

    def attend(
        self,
        part: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        values: list[torch.Tensor],
        keys: list[Key],
    ) -> torch.Tensor:
        q = self.query(part, values[-1])
        return depth_attend(q, values, self._keys(keys), self.gate)

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

    def online(self, emb: torch.Tensor) -> OnlineDepth | NativeDepth:
        """Inference over the static queries: `NativeDepth` (compiled kernels) on a CPU in
        fp32/fp64 where they could be built, else `OnlineDepth`. The scaled queries are made
        once per parameter state and reused while the parameters are the same tensors, at the
        same version (an optimiser step or a loaded state bumps it) and in the same storage
        (`.to`, `.double()` swap it under the same parameter): derived from the parameters,
        not state of a forward pass."""
        get = self._parameters.get  # (not the module's attribute lookup: this runs per token)
        q, a, g, ag = get("queries"), get("agg_query"), get("key_gains"), get("agg_key_gain")
        stamp = (id(q), q._version, q.data_ptr(), id(a), a._version, a.data_ptr())
        if g is not None and ag is not None:
            stamp += (id(g), g._version, g.data_ptr(), id(ag), ag._version, ag.data_ptr())
        cached = self._scaled
        if cached is None or cached[0] != stamp:
            # (the parameters are kept with the stamp: their ids cannot be reused meanwhile)
            cached = self._scaled = (stamp, (q, a, g, ag), ScaledQueries(self.static_queries()))
        queries = cached[2]
        if native.serves(queries, emb):
            return NativeDepth(queries, emb)
        return OnlineDepth(queries, emb)

    def blocks(self) -> list[range]:
        S, L = self.block_size, self.n_sublayers
        return [range(s, min(s + S, L)) for s in range(0, L, S)]

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
        depth = self.online(emb)
        L = self.n_sublayers
        for block in self.blocks():
            partial: torch.Tensor | None = None
            for l in block:
                h = depth.input(l) if partial is None else depth.merged(l, partial)
                out = sublayer(l, h).to(emb.dtype)
                partial = out if partial is None else partial + out
            assert partial is not None
            if block.stop < L:
                depth.push(partial, block.stop)
        return depth.merged(L, partial)  # the last block is the aggregation's last source


class FullAttnRes(_AttnResBase):
    """Full AttnRes: sublayer l attends to v_0 (the embedding) and every earlier output."""

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        if self.input_proj is None:
            return {"stack": self.stack(emb, self.n_sublayers + 1)}
        return {"values": [emb], "keys": [self.key(emb)], "split": self.split()}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        if "stack" in state:
            return state["stack"].attend(l)
        return self.attend(state["split"][l], state["values"], state["keys"])

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        if "stack" in state:
            state["stack"].push(out)
            return
        state["values"].append(out)
        state["keys"].append(self.key(out))

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        if "stack" in state:
            return state["stack"].attend(self.n_sublayers)
        return self.aggregate(state["values"], state["keys"])


class BlockAttnRes(_AttnResBase):
    """Block AttnRes with S sublayers per block (the last block may be shorter).

    Sources of the i-th sublayer (1-based) of block n: the embedding b_0 (never folded into a
    block), the finished blocks b_1 … b_n, and for i ≥ 2 the running partial sum b_n^{i−1}
    (b_n^0 = 0 is never a source). A block's representation is the sum of its outputs.
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__(cfg)
        assert cfg.block_size is not None
        self.block_size = cfg.block_size

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        stack = self.stack(emb, len(self.blocks()) + 1)
        return {"stack": stack, "partial": None, "partial_key": None}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        if state["partial"] is not None and state["partial_key"] is None:
            state["partial_key"] = self.key(state["partial"])
        return state["stack"].attend(l, state["partial"], state["partial_key"])

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        partial = out if state["partial"] is None else state["partial"] + out
        state["partial"], state["partial_key"] = partial, None
        if (l + 1) % self.block_size == 0 or l + 1 == self.n_sublayers:  # block complete
            state["stack"].push(partial)
            state["partial"] = None

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        return state["stack"].attend(self.n_sublayers)


class MHCLite(DepthMixer):
    """mHC-lite (arXiv 2601.05732) with n streams X ∈ R^{n×d} per token.

    Per sublayer, from the flattened, parameter-free RMS-normalised state x̃ = norm(vec X):
    c = x̃·W_l (W_l ∈ R^{nd×(2n+n!)}, zero at init), scaled by three learned gates
    α_pre, α_post, α_res (0.01 at init) and shifted by biases b_l:
    H_pre = σ(·) (n), H_post = 2σ(·) (n), H_res = Σ_π softmax(·)_π·P_π over the n! permutation
    matrices — exactly doubly stochastic. Input h = H_preᵀX; update X' = H_res·X + H_post ⊗ f(h).
    Init: b_pre = logit(1/n) (h starts as the mean of the streams), b_post = 0 (H_post = 1),
    permutation logits 0 for the identity and −8 for the others (H_res ≈ I). The embedding is
    copied into every stream; the output is the sum of the streams.
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__(cfg)
        n, d, sub = cfg.streams, cfg.d_model, cfg.n_sublayers
        perms = list(itertools.permutations(range(n)))
        self.n = n
        self.k = 2 * n + len(perms)
        eye = torch.eye(n)
        self.register_buffer(
            "perm_mats", torch.stack([eye[list(p)] for p in perms]), persistent=False
        )
        self.proj = nn.Parameter(torch.zeros(sub, n * d, self.k))
        self.bias = nn.Parameter(torch.zeros(sub, self.k))
        self.gates = nn.Parameter(torch.zeros(sub, 3))

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        # The per-sublayer parameters split once: the gradients of one `unbind` are stacked in
        # one go, where an index per sublayer would zero-fill the whole tensor for each.
        split = (self.proj.unbind(0), self.gates.unbind(0), self.bias.unbind(0))
        params = list(zip(*split, strict=True))
        return {"X": emb[:, :, None, :].repeat(1, 1, self.n, 1), "params": params}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        # The update after sublayer l−1 and the coefficients of sublayer l are one function
        # (`streams.transition`): see workers/model/streams.py for why.
        params = (*state["params"][l], self.perm_mats)
        if l == 0:
            h, state["H_res"], state["H_post"] = streams.enter(state["X"], *params)
        else:
            X, H, post, f = state["X"], state["H_res"], state["H_post"], state.pop("f")
            state["X"], h, state["H_res"], state["H_post"] = streams.transition(
                X, H, post, f, *params
            )
        return h

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        if l + 1 < self.n_sublayers:
            state["f"] = out  # applied by the next `input`, fused with its coefficients
        else:
            state["X"] = streams.update(state["X"], state["H_res"], state["H_post"], out)

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        return state["X"].sum(dim=2)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        n = self.n
        self.proj.zero_()
        self.gates.fill_(0.01)
        self.bias.zero_()
        self.bias[:, :n] = math.log((1 / n) / (1 - 1 / n))  # σ(b) = 1/n
        self.bias[:, 2 * n :] = -8.0
        self.bias[:, 2 * n] = 0.0  # permutation 0 of itertools.permutations is the identity


class DenseFormer(DepthMixer):
    """DenseFormer (arXiv 2402.02622): a standard residual inside each Transformer block and,
    after block i, the depth-weighted average x̂_i = Σ_{j≤i} α_{i,j}·X_j over the embedding X_0
    and the block outputs X_1 … X_i; static learned weights, no softmax, identity at init
    (α_{i,i} = 1, the others 0)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__(cfg)
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.zeros(i + 1)) for i in range(1, cfg.n_layers + 1)]
        )

    def begin(self, emb: torch.Tensor) -> dict[str, Any]:
        return {"h": emb, "outputs": [emb]}

    def input(self, state: dict[str, Any], l: int) -> torch.Tensor:
        return state["h"]

    def record(self, state: dict[str, Any], l: int, out: torch.Tensor) -> None:
        h = state["h"] + out
        if l % 2 == 1:  # end of Transformer block i = (l + 1) / 2
            state["outputs"].append(h)
            h = weighted_sum(self.weights[l // 2], state["outputs"])
        state["h"] = h

    def finish(self, state: dict[str, Any]) -> torch.Tensor:
        return state["h"]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for w in self.weights:
            w.zero_()
            w[-1] = 1.0


MIXERS: dict[str, type[DepthMixer]] = {
    "baseline": StandardResidual,
    "full_attnres": FullAttnRes,
    "attnres_input_query": FullAttnRes,
    "attnres_sigmoid": FullAttnRes,
    "attnres_no_key_norm": FullAttnRes,
    "block_attnres": BlockAttnRes,
    "mhc_lite": MHCLite,
    "denseformer": DenseFormer,
}


def make_mixer(cfg: ArchConfig) -> DepthMixer:
    return MIXERS[cfg.variant](cfg)
