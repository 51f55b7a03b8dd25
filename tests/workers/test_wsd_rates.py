"""The learning rate of every parameter group at every optimizer step of a WSD run, read off
the optimizer as it steps, against the schedule written out here: warmup, the stable phase,
the main line's own decay, and a segment's decay branch (`depth_lr_mult` on the depth-mixing
group throughout)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from cost_model import ArchConfig
from workers.contract import TrainSpec
from workers.data import Corpus, load_corpus
from workers.store import ArtifactStore
from workers.train import train

ARCH = ArchConfig(
    n_layers=2, d_model=32, n_heads=2, seq_len=32, variant="block_attnres", block_size=2
)
T = 40
LR, FLOOR_RATIO, MULT = 1e-2, 0.1, 3.0
MULTS = {"decay": 1.0, "no_decay": 1.0, "depth_mixing": MULT}


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://wsd-rates-{secrets.token_hex(6)}"
    yield url
    store = ArtifactStore(url)
    for key in store.keys():  # noqa: SIM118 (a list of keys, not a dict)
        store.delete(key)


def wsd(warmup_frac: float, decay_frac: float, **kw: Any) -> TrainSpec:
    return TrainSpec(
        arch=ARCH,
        budget_tokens=4 * 32 * T,
        batch_size=4,
        lr=LR,
        min_lr_ratio=FLOOR_RATIO,
        depth_lr_mult=MULT,
        schedule="wsd",
        warmup_frac=warmup_frac,
        decay_frac=decay_frac,
        eval_interval=T,
        eval_batches=1,
        threads=1,
        **kw,
    )


def main_line(step: int, warmup_frac: float, decay_frac: float) -> float:
    """WSD at 0-based `step` of T: a linear warmup over W = max(1, ⌊warmup_frac·T⌋) steps to
    lr ((step + 1)/W), lr until D = T − ⌊decay_frac·T⌋, then linear to the floor, reached at
    the last step ((step − D + 1)/(T − D))."""
    floor = FLOOR_RATIO * LR
    w = max(1, int(warmup_frac * T)) if warmup_frac > 0 else 0
    if step < w:
        return LR * (step + 1) / w
    d = T - int(decay_frac * T)
    if step < d:
        return LR
    return LR + (floor - LR) * (step - d + 1) / (T - d)


def branch(j: int, stop: int, warmup_frac: float, decay_frac: float) -> float:
    """Step j of the decay branch after the main line's step `stop`, n = max(1,
    ⌊decay_frac·stop⌋) steps: from the main line's next rate to the floor, reached at its last
    step."""
    n = max(1, int(decay_frac * stop))
    base, floor = main_line(stop, warmup_frac, decay_frac), FLOOR_RATIO * LR
    return base + (floor - base) * (j + 1) / n


def recorded(spec: TrainSpec, corpus: Corpus) -> list[dict[str, float]]:
    """Train `spec`; every optimizer step's learning rate per group, as the step is taken."""
    steps: list[dict[str, float]] = []

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        steps.append({g["name"]: float(g["lr"]) for g in opt.param_groups})

    handle = register_optimizer_step_pre_hook(hook)
    try:
        result = train(spec, corpus=corpus)
    finally:
        handle.remove()
    assert result.status == "completed", result.reason
    return steps


def assert_rates(got: list[dict[str, float]], expected: list[float]) -> None:
    assert len(got) == len(expected)
    for i, (groups, lr) in enumerate(zip(got, expected, strict=True)):
        assert set(groups) == set(MULTS)
        for name, lr_of_group in groups.items():
            assert lr_of_group == pytest.approx(lr * MULTS[name], rel=1e-12, abs=0), (i, name)


@pytest.mark.parametrize(("warmup_frac", "decay_frac"), [(0.1, 0.25), (0.0, 0.2), (0.25, 0.5)])
def test_every_group_s_rate_on_the_main_line(
    warmup_frac: float, decay_frac: float, corpus: Corpus
) -> None:
    got = recorded(wsd(warmup_frac, decay_frac), corpus)
    assert_rates(got, [main_line(s, warmup_frac, decay_frac) for s in range(T)])
    assert got[-1]["decay"] == pytest.approx(FLOOR_RATIO * LR)  # the floor at the last step


@pytest.mark.parametrize(
    ("warmup_frac", "decay_frac", "start", "stop"),
    [
        (0.1, 0.25, 0, 20),  # a branch from the stable phase (5 steps)
        (0.3, 0.25, 0, 10),  # a branch from inside the warmup (W = 12; 2 steps)
        (0.1, 0.25, 20, 30),  # a resumed segment up to the stable phase's end (7 steps)
        (0.1, 0.02, 0, 20),  # a branch of a single step
    ],
)
def test_every_group_s_rate_on_a_segment_and_its_decay_branch(
    warmup_frac: float, decay_frac: float, start: int, stop: int, corpus: Corpus, memory_url: str
) -> None:
    spec = wsd(warmup_frac, decay_frac)
    if start > 0:  # the checkpoint it resumes from
        before = spec.replace(stop_step=start, checkpoint_out="run/a", artifact_store=memory_url)
        train(before, corpus=corpus)
    segment = spec.replace(
        start_step=start,
        stop_step=stop,
        checkpoint_in="run/a" if start > 0 else None,
        checkpoint_out="run/b",
        artifact_store=memory_url,
    )
    got = recorded(segment, corpus)
    n = max(1, int(decay_frac * stop))
    expected = [main_line(s, warmup_frac, decay_frac) for s in range(start, stop)]
    expected += [branch(j, stop, warmup_frac, decay_frac) for j in range(n)]
    assert_rates(got, expected)
    assert got[-1]["decay"] == pytest.approx(FLOOR_RATIO * LR)  # the branch ends at the floor
