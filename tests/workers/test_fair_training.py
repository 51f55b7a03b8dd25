"""Fair comparisons on the workers' side: the optimizer's parameter groups by name and count for
every variant (depth mixing never weight-decayed), `depth_lr_mult` (0 freezes exactly the
depth-mixing parameters, 10 scales only their steps), and paired seeds (two variants of one
shape with one seed start from the same Transformer and train on the same batches)."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from torch import nn

from cost_model import VARIANTS, ArchConfig, param_count
from workers.contract import TrainSpec, TrainSpecError
from workers.data import Corpus, load_corpus
from workers.model import MIXERS, DenseFormer, DepthscopeLM, Impl
from workers.train import (
    GROUPS,
    initial_model,
    lr_at,
    make_optimizer,
    parameter_groups,
    set_learning_rates,
    train,
    train_batches,
)

from .support import RecordingCorpus, make, perturb

SMALL = {"n_layers": 2, "d_model": 32, "n_heads": 2}
#: Every optional parameter of the Transformer present: biases, LayerNorm, learned positions,
#: SwiGLU's gate, an untied head.
FULL = {
    **SMALL,
    "mlp": "swiglu",
    "norm": "layernorm",
    "positions": "learned",
    "bias": True,
    "tie_embeddings": False,
}
SHAPES = {"small": SMALL, "full": FULL}

#: The Transformer's own parameters, written down from workers/model/layers.py and lm.py.
LINEAR = r"blocks\.\d+\.(attn\.(q|k|v|o)|mlp\.(up|gate|down))"
DECAY = re.compile(rf"(tok_emb|pos_emb|lm_head)\.weight|{LINEAR}\.weight")
NO_DECAY = re.compile(rf"(blocks\.\d+\.(attn_norm|mlp_norm)|norm_f)\.(weight|bias)|{LINEAR}\.bias")

#: The depth-mixing parameters, written down from each mixer's module.
ATTNRES = {"mixer.queries", "mixer.agg_query", "mixer.key_gains", "mixer.agg_key_gain"}


def expected_depth_mixing(cfg: ArchConfig) -> set[str]:
    expected = {
        "baseline": set(),
        "full_attnres": ATTNRES,
        "block_attnres": ATTNRES,
        "attnres_sigmoid": ATTNRES,
        "attnres_no_key_norm": {"mixer.queries", "mixer.agg_query"},
        "attnres_input_query": ATTNRES | {"mixer.input_proj"},
        "mhc_lite": {"mixer.proj", "mixer.bias", "mixer.gates"},
        "denseformer": {f"mixer.weights.{i}" for i in range(cfg.n_layers)},
    }
    assert set(expected) == set(VARIANTS), "a variant without written-down depth mixing"
    return expected[cfg.variant]


def spec_of(cfg: ArchConfig, **kw: object) -> TrainSpec:
    base: dict[str, object] = {
        "arch": cfg,
        "budget_tokens": 4 * 4 * cfg.seq_len,
        "batch_size": 4,
        "lr": 1e-2,
        "warmup_frac": 0.0,
        "n_evals": 1,
        "eval_batches": 1,
        "threads": 1,
    }
    base.update(kw)
    return TrainSpec(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def common(model: DepthscopeLM) -> dict[str, torch.Tensor]:
    """The Transformer's own parameters (every one but the mixer's)."""
    return {name: p for name, p in snapshot(model).items() if not name.startswith("mixer.")}


# -- the parameter groups ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_parameter_groups_by_name_and_count(variant: str, shape: str) -> None:
    cfg = make(variant, **SHAPES[shape])  # type: ignore[arg-type]
    model = initial_model(spec_of(cfg))
    groups = parameter_groups(model)
    assert tuple(groups) == GROUPS == ("decay", "no_decay", "depth_mixing")
    named = dict(model.named_parameters())
    listed = [name for names in groups.values() for name in names]
    assert sorted(listed) == sorted(named)  # every parameter in exactly one group
    depth = set(groups["depth_mixing"])
    assert depth == expected_depth_mixing(cfg)
    assert depth == {name for name in named if name.startswith("mixer.")}
    assert set(model.depth_mixing_parameter_names()) == depth
    assert all(DECAY.fullmatch(name) for name in groups["decay"]), groups["decay"]
    assert all(NO_DECAY.fullmatch(name) for name in groups["no_decay"]), groups["no_decay"]
    assert {n for n in named if DECAY.fullmatch(n)} == set(groups["decay"])
    assert {n for n in named if NO_DECAY.fullmatch(n)} == set(groups["no_decay"])
    # the count is the cost model's: the wiring inside the stack and the output aggregation
    counts = param_count(cfg)
    in_depth = sum(named[name].numel() for name in depth)
    assert in_depth == counts.depth_mixing + counts.depth_aggregation
    assert sum(p.numel() for p in named.values()) == counts.total
    if variant == "baseline":
        assert groups["depth_mixing"] == []
    else:
        assert in_depth > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_mixer_declares_its_own_parameters(variant: str) -> None:
    impls: tuple[Impl, ...] = ("fast", "reference")
    for impl in impls:
        mixer = DepthscopeLM(make(variant, **SMALL), mixer_impl=impl).mixer
        declared = mixer.depth_mixing_parameters()
        own = sorted(name for name, _ in mixer.named_parameters())
        assert sorted(name for name, _ in declared) == own
        for name, p in declared:
            assert p is mixer.get_parameter(name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_optimizer_groups(variant: str) -> None:
    cfg = make(variant, **FULL)  # type: ignore[arg-type]
    spec = spec_of(cfg, weight_decay=0.07, depth_lr_mult=3.0)
    model = initial_model(spec)
    opt = make_optimizer(model, spec)
    groups = parameter_groups(model)
    name_of = {id(p): name for name, p in model.named_parameters()}
    seen = [id(p) for group in opt.param_groups for p in group["params"]]
    assert len(seen) == len(set(seen)) == len(name_of)  # each parameter exactly once
    by_name = {group["name"]: group for group in opt.param_groups}
    nonempty = [name for name in GROUPS if groups[name]]
    assert list(by_name) == nonempty
    assert ("depth_mixing" in by_name) == (variant != "baseline")
    settings = {"decay": (0.07, 1.0), "no_decay": (0.0, 1.0), "depth_mixing": (0.0, 3.0)}
    for name, group in by_name.items():
        assert [name_of[id(p)] for p in group["params"]] == groups[name]
        assert (group["weight_decay"], group["lr_mult"]) == settings[name]
        assert group["lr"] == pytest.approx(spec.lr * settings[name][1])


# -- depth_lr_mult ----------------------------------------------------------------------------
def run_steps(
    spec: TrainSpec, corpus: Corpus, steps: int
) -> tuple[DepthscopeLM, torch.optim.Optimizer]:
    """`steps` real optimizer steps of the trainer's pieces: its initial model (every
    parameter moved off its initial value, so every gradient is non-zero: zero-initialised
    queries would leave the key gains without one), its optimizer, learning rates and
    batches."""
    model = initial_model(spec)
    perturb(model, 0.05)
    opt = make_optimizer(model, spec)
    for step, (x, y) in zip(range(steps), train_batches(corpus, spec), strict=False):
        set_learning_rates(opt, spec, step, steps)
        _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


@pytest.mark.parametrize("variant", VARIANTS)
def test_depth_lr_mult_zero_freezes_exactly_the_depth_mixing(variant: str, corpus: Corpus) -> None:
    cfg = make(variant, **SMALL)
    model = initial_model(spec_of(cfg))
    perturb(model, 0.05)
    before = snapshot(model)
    depth = expected_depth_mixing(cfg)
    for mult in (0.0, 1.0):
        after = snapshot(run_steps(spec_of(cfg, depth_lr_mult=mult), corpus, 3)[0])
        assert after.keys() == before.keys()
        for name in after:
            unchanged = torch.equal(after[name], before[name])
            if mult == 0.0 and name in depth:
                assert unchanged, f"{name} moved with depth_lr_mult=0"
            else:
                assert not unchanged, f"{name} did not move (depth_lr_mult={mult})"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "baseline"])
def test_depth_lr_mult_scales_only_the_depth_mixing_steps(variant: str, corpus: Corpus) -> None:
    cfg = make(variant, **SMALL)
    start = initial_model(spec_of(cfg))
    perturb(start, 0.05)
    before = snapshot(start)
    depth = expected_depth_mixing(cfg)
    runs = {mult: run_steps(spec_of(cfg, depth_lr_mult=mult), corpus, 1) for mult in (1.0, 10.0)}
    base_spec = spec_of(cfg)
    for mult, (_, opt) in runs.items():
        set_learning_rates(opt, spec_of(cfg, depth_lr_mult=mult), 1, 4)  # the next step's
        lrs = {group["name"]: group["lr"] for group in opt.param_groups}
        assert lrs["decay"] == lrs["no_decay"] == lr_at(base_spec, 1, 4)
        assert lrs["depth_mixing"] == pytest.approx(mult * lr_at(base_spec, 1, 4), rel=1e-12)
    one, ten = (snapshot(runs[mult][0]) for mult in (1.0, 10.0))
    for name in before:
        if name in depth:
            # Adam's first step is lr·g/(|g| + ε): ten times the learning rate, ten times the
            # step, from the same gradient (to the rounding of values up to 8 in float32: mHC's
            # permutation biases start at −8, where a float32 step is 1e-6)
            torch.testing.assert_close(
                ten[name] - before[name], 10 * (one[name] - before[name]), rtol=1e-3, atol=1e-5
            )
            assert not torch.equal(one[name], before[name])
        else:
            assert torch.equal(ten[name], one[name]), name


# -- paired seeds -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_same_seed_same_initial_transformer_for_every_variant(shape: str) -> None:
    def initial(variant: str, seed: int) -> dict[str, torch.Tensor]:
        cfg = make(variant, **SHAPES[shape])  # type: ignore[arg-type]
        return common(initial_model(spec_of(cfg, seed=seed)))

    for seed in (0, 7):
        reference = initial("baseline", seed)
        other_seed = initial("baseline", seed + 1)
        random = [n for n in reference if DECAY.fullmatch(n)]  # the drawn ones (norms are 1)
        assert random and all(not torch.equal(reference[n], other_seed[n]) for n in random)
        for variant in VARIANTS:
            values = initial(variant, seed)
            assert values.keys() == reference.keys()
            for name, value in values.items():
                assert torch.equal(value, reference[name]), (variant, seed, name)


class DrawingDenseFormer(DenseFormer):
    """DenseFormer as a mixer with a random initialisation would be: its construction draws
    from the global generator (a Linear's Kaiming-uniform weight) and so does its
    `reset_parameters` (normal depth weights). The model must keep these draws away from the
    Transformer's."""

    def __init__(self, cfg: ArchConfig, impl: Impl = "fast") -> None:
        super().__init__(cfg, impl)
        self.extra = nn.Linear(cfg.d_model, cfg.d_model)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        super().reset_parameters()
        for w in self.weights:
            w.normal_()


def test_a_mixer_drawing_random_numbers_does_not_shift_the_common_initialisation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(MIXERS, "denseformer", DrawingDenseFormer)
    shapes = {variant: make(variant, **FULL) for variant in ("baseline", "denseformer")}  # type: ignore[arg-type]
    drawn = {}
    for seed in (0, 1):
        models, after = {}, {}
        for variant, cfg in shapes.items():
            models[variant] = initial_model(spec_of(cfg, seed=seed))
            after[variant] = torch.rand(4)  # where the global stream stands after building
        reference = common(models["baseline"])
        values = common(models["denseformer"])
        assert values.keys() == reference.keys()
        for name, value in values.items():
            assert torch.equal(value, reference[name]), name
        assert torch.equal(after["denseformer"], after["baseline"])
        mixer = models["denseformer"].mixer
        assert isinstance(mixer, DrawingDenseFormer)
        drawn[seed] = torch.cat([w.detach().clone() for w in mixer.weights])
        again = initial_model(spec_of(shapes["denseformer"], seed=seed)).mixer
        assert isinstance(again, DrawingDenseFormer)
        assert torch.equal(torch.cat([w.detach() for w in again.weights]), drawn[seed])
    assert not torch.equal(drawn[0], drawn[1])  # the mixer did draw


def test_same_seed_same_training_batches_for_every_variant(corpus: Corpus) -> None:
    steps = 4

    def trained_on(variant: str, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = make(variant, **SMALL)
        spec = spec_of(cfg, seed=seed, budget_tokens=steps * 4 * cfg.seq_len)
        recording = RecordingCorpus.of(corpus)
        result = train(spec, corpus=recording)
        assert result.status == "completed" and result.steps == steps
        drawn = recording.drawn
        assert len(drawn) == steps
        # what the trainer drew is the spec's batch sequence
        expected = itertools.islice(train_batches(corpus, spec), steps)
        for (x, y), (bx, by) in zip(drawn, expected, strict=True):
            assert torch.equal(x, bx) and torch.equal(y, by)
        return drawn

    for seed in (0, 5):
        reference = trained_on("baseline", seed)
        for variant in VARIANTS:
            if variant == "baseline":
                continue
            for (x, y), (rx, ry) in zip(trained_on(variant, seed), reference, strict=True):
                assert torch.equal(x, rx) and torch.equal(y, ry), (variant, seed)
        other = trained_on("baseline", seed + 1)
        assert all(not torch.equal(x, rx) for (x, _), (rx, _) in zip(other, reference, strict=True))


# -- the contract -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1.0, -1e-12, math.nan, math.inf, -math.inf])
def test_trainspec_refuses_a_bad_depth_lr_mult(value: float) -> None:
    with pytest.raises(TrainSpecError) as refused:
        spec_of(make("full_attnres", **SMALL), depth_lr_mult=value)
    assert refused.value.field == "depth_lr_mult"
    assert "finite non-negative" in refused.value.reason and str(value) in refused.value.reason


def test_trainspec_depth_lr_mult_default_and_bounds() -> None:
    cfg = make("full_attnres", **SMALL)
    assert spec_of(cfg).depth_lr_mult == 1.0
    for value in (0.0, 0.1, 10.0):
        assert spec_of(cfg, depth_lr_mult=value).depth_lr_mult == value
