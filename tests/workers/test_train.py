"""The fixed-budget trainer on the real built-in corpus (tiny models, CPU)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest

from cost_model import ArchConfig, tokens_for_budget, training_flops_per_token
from workers.contract import EvalPoint, TrainSpec, TrainSpecError
from workers.data import Corpus, load_corpus
from workers.train import lr_at, train

TINY = ArchConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def spec(**kw: object) -> TrainSpec:
    base: dict[str, object] = {
        "arch": TINY,
        "budget_tokens": 8 * 64 * 40,
        "batch_size": 8,
        "threads": 1,
    }
    base.update(kw)
    return TrainSpec(**base)  # type: ignore[arg-type]


def test_flops_budget_buys_the_cost_model_tokens(corpus: Corpus) -> None:
    budget = 2e10
    for arch in (
        TINY,
        TINY.replace(variant="full_attnres"),
        TINY.replace(n_layers=4, d_model=32, n_heads=2),
    ):
        s = spec(arch=arch, budget_tokens=None, budget_flops=budget, n_evals=2)
        result = train(s, corpus=corpus)
        per_token = training_flops_per_token(arch, causal=True)
        step_tokens = 8 * 64
        assert result.steps == tokens_for_budget(arch, budget) // step_tokens
        assert result.tokens_seen == result.steps * step_tokens
        assert result.flops_spent == pytest.approx(result.tokens_seen * per_token)
        assert budget - step_tokens * per_token < result.flops_spent <= budget
        assert result.flops_budget == budget


def test_training_learns_and_reports(corpus: Corpus) -> None:
    steps_seen: list[int] = []
    result = train(
        spec(budget_tokens=8 * 64 * 120, lr=1e-2, eval_interval=30),
        on_step=lambda step, steps, loss: steps_seen.append(step),
        corpus=corpus,
    )
    assert result.status == "completed"
    assert steps_seen == list(range(1, 121))
    assert [p.step for p in result.curve] == [30, 60, 90, 120]
    assert result.curve[-1].val_loss < result.curve[0].val_loss < math.log(256)
    assert result.final_val_loss == result.curve[-1].val_loss
    assert result.final_val_loss < 3.3  # bytes of Python source: far below uniform (5.55)
    assert result.tokens_per_s > 0 and result.wall_time_s > 0
    assert result.peak_memory_bytes > 0 and result.memory_kind == "cpu_saved_tensors"
    assert result.corpus["name"] == corpus.info.name
    assert result.corpus["checksum"] == corpus.info.checksum
    assert result.params == 2 * (4 * 64 * 64 + 2 * 64 * 256) + 5 * 64 + 256 * 64
    json.dumps(result.as_dict())  # plain data all the way down


def test_callback_stops_the_run(corpus: Corpus) -> None:
    seen: list[EvalPoint] = []

    def stop_after_second(point: EvalPoint) -> bool:
        seen.append(point)
        return len(seen) == 2

    result = train(spec(eval_interval=5), on_eval=stop_after_second, corpus=corpus)
    assert result.status == "stopped"
    assert result.steps == 10 and len(result.curve) == 2
    assert result.tokens_seen == 10 * 8 * 64
    assert "callback" in result.reason


def test_exploding_loss_is_a_result_not_an_exception(corpus: Corpus) -> None:
    result = train(spec(lr=50.0, warmup_frac=0.0, grad_clip=1e9, eval_interval=2), corpus=corpus)
    assert result.status == "diverged"
    assert "loss" in result.reason or "gradient" in result.reason
    assert result.steps < 40


def test_same_seed_same_curve(corpus: Corpus) -> None:
    a = train(spec(n_evals=3, seed=3), corpus=corpus)
    b = train(spec(n_evals=3, seed=3), corpus=corpus)
    c = train(spec(n_evals=3, seed=4), corpus=corpus)
    assert [p.val_loss for p in a.curve] == [p.val_loss for p in b.curve]
    assert [p.val_loss for p in a.curve] != [p.val_loss for p in c.curve]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"budget_tokens": None}, "budget"),
        ({"budget_flops": 1e9}, "budget"),
        ({"budget_tokens": 0}, "budget_tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"schedule": "linear"}, "schedule"),
        ({"warmup_frac": 1.5}, "warmup_frac"),
        ({"device": "tpu"}, "device"),
        ({"eval_interval": 0}, "eval_interval"),
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(TrainSpecError) as info:
        spec(**changes)
    assert info.value.field == field


def test_budget_below_one_step_is_refused(corpus: Corpus) -> None:
    with pytest.raises(TrainSpecError, match=r"budget: buys 100 tokens"):
        train(spec(budget_tokens=100), corpus=corpus)


def test_vocab_mismatch_is_refused(corpus: Corpus) -> None:
    with pytest.raises(TrainSpecError, match=r"arch\.vocab_size"):
        train(spec(arch=TINY.replace(vocab_size=100)), corpus=corpus)


def test_schedules() -> None:
    s = spec(lr=1.0, warmup_frac=0.1, min_lr_ratio=0.1)
    cos = [lr_at(s, i, 100) for i in range(100)]
    assert cos[0] == pytest.approx(0.1) and cos[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(cos[9:]))
    assert cos[-1] == pytest.approx(0.1, abs=1e-3)
    w = spec(lr=1.0, warmup_frac=0.1, decay_frac=0.2, min_lr_ratio=0.0, schedule="wsd")
    wsd = [lr_at(w, i, 100) for i in range(100)]
    assert wsd[10:80] == [1.0] * 70
    assert wsd[-1] == pytest.approx(0.0) and wsd[85] < wsd[80]


def test_cli_trains_one_candidate() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nas_service.cli",
            "train",
            "--n-layers",
            "1",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--seq-len",
            "32",
            "--batch-size",
            "4",
            "--tokens",
            "2048",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "completed" and result["steps"] == 16
    assert "step/s" in out.stderr or "step" in out.stderr  # the progress bar
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "nas_service.cli",
            "train",
            "--n-layers",
            "1",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--tokens",
            "10",
            "--corpus",
            "/nonexistent/corpus.txt",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "corpus" in bad.stderr


@pytest.mark.slow
def test_torch_compile_trains_like_eager(corpus: Corpus) -> None:
    """torch.compile is optional and off by default; on, it trains the same model to the same
    losses up to compiled-kernel rounding."""
    arch = TINY.replace(variant="block_attnres", block_size=2)
    eager = train(spec(arch=arch, budget_tokens=8 * 64 * 12, n_evals=2), corpus=corpus)
    compiled = train(
        spec(arch=arch, budget_tokens=8 * 64 * 12, n_evals=2, compile=True), corpus=corpus
    )
    assert compiled.status == eager.status == "completed"
    for a, b in zip(compiled.curve, eager.curve, strict=True):
        assert a.val_loss == pytest.approx(b.val_loss, abs=2e-2)
