"""Corpora and tokenizers through the runner: every trial records `val_bpb` (its validation
loss in bits per UTF-8 byte of text) beside `val_loss`, which can be an objective and is a
metric of the analyses; a corpus of raw tokens has no bytes, so val_bpb as an objective fails
its trials with the reason instead of telling Optuna a NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from cost_model import ArchConfig, param_count, tokens_for_budget
from nas_service.jobs import submit
from nas_service.results.decode import _row
from nas_service.runner.loop import Runner
from nas_service.search.pricing import price_candidate
from nas_service.spec import SpecError, parse_spec
from nas_service.spec.candidates import build_candidate
from tests.support.jobs import TINY, counted, setup, study_of

TEXT = "to be or not to be, that is the question\n" * 400


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_val_bpb_is_recorded_and_can_be_the_objective(sqlite_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "plays.txt").write_text(TEXT)
    settings, Session = setup(sqlite_url, data_dir=data)
    training = TINY["training"] | {"corpus": "plays.txt"}
    spec = TINY | {"n_trials": 2, "objectives": ["val_bpb", "params"], "training": training}
    job = submit(Session, settings, spec)
    Runner(settings).run(timeout_s=300)
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 2
    for t in trials:
        assert t.state == TrialState.COMPLETE, t.user_attrs
        run = t.user_attrs["train"][0]
        assert run["final_val_bpb"] == pytest.approx(run["final_val_loss"] / math.log(2))
        assert t.values is not None
        assert t.values[0] == pytest.approx(run["final_val_bpb"])
        assert t.user_attrs["val_bpb"] == pytest.approx(t.values[0])
        row = _row(t, ["val_bpb", "params"], None)
        assert row.metrics["val_bpb"] == pytest.approx(t.values[0])
        assert row.metrics["val_loss"] == pytest.approx(run["final_val_loss"])


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_val_loss_jobs_record_val_bpb_as_a_metric(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    job = submit(Session, settings, TINY | {"n_trials": 1})
    Runner(settings).run(timeout_s=300)
    (t,) = counted(study_of(sqlite_url, job))
    assert t.state == TrialState.COMPLETE, t.user_attrs
    row = _row(t, ["val_loss"], None)
    assert row.metrics["val_bpb"] == pytest.approx(row.metrics["val_loss"] / math.log(2))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_val_bpb_of_raw_tokens_fails_with_the_reason(sqlite_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (np.arange(6000) % 250).astype("<u2").tofile(data / "tokens.u16")
    settings, Session = setup(sqlite_url, data_dir=data)
    training = TINY["training"] | {"corpus": "tokens.u16"}
    spec = TINY | {"n_trials": 1, "objectives": ["val_bpb"], "training": training}
    job = submit(Session, settings, spec)
    Runner(settings).run(timeout_s=300)
    (t,) = counted(study_of(sqlite_url, job))
    assert t.state == TrialState.FAIL
    assert "raw tokens" in t.user_attrs["reason"]
    assert t.user_attrs["train"][0]["final_val_bpb"] is None


# -- the tokenizer in the spec: its vocabulary reaches the cost model ---------------------
def bpe_spec(**training: object) -> dict[str, object]:
    return TINY | {
        "training": TINY["training"] | {"tokenizer": {"kind": "bpe", "vocab_size": 2048}} | training
    }


def test_a_bpe_vocabulary_is_the_model_vocabulary_the_cost_model_prices() -> None:
    byte = parse_spec(TINY)
    bpe = parse_spec(bpe_spec())
    assert bpe.training.vocab_size == 2048
    params = {"residual": "baseline", "n_layers": 2, "d_model": 64}
    a, b = price_candidate(byte, params), price_candidate(bpe, params)
    assert b.train_spec is not None and b.train_spec.arch.vocab_size == 2048
    assert (b.train_spec.tokenizer, b.train_spec.tokenizer_vocab) == ("bpe", 2048)
    arch = b.train_spec.arch
    assert b.metrics["params"] == param_count(arch).total
    assert (
        b.metrics["params"] - a.metrics["params"] == (2048 - 256) * 64
    )  # the tied embedding's new rows
    assert b.metrics["train_flops_per_token"] > a.metrics["train_flops_per_token"]
    # a FLOPs budget buys the tokens of the larger model
    flops = {"budget": {"flops": 1e12}}
    c = price_candidate(parse_spec(bpe_spec() | flops), params)
    assert c.train_spec is not None
    assert c.train_spec.planned_tokens() == tokens_for_budget(arch, 1e12)
    d = price_candidate(parse_spec(TINY | flops), params).train_spec
    assert d is not None and c.train_spec.planned_tokens() < d.planned_tokens()


def test_params_target_solves_the_width_with_the_bpe_vocabulary() -> None:
    space = TINY["space"] | {"d_model": None, "params_target": {"params": 400_000}}
    byte = parse_spec(TINY | {"space": space})
    bpe = parse_spec(bpe_spec() | {"space": space})
    params = {"residual": "baseline", "n_layers": 2}
    a = build_candidate(byte, params | {"variant": "baseline"})
    b = build_candidate(bpe, params | {"variant": "baseline"})
    assert a.arch is not None and b.arch is not None
    assert b.arch.vocab_size == 2048 and b.arch.d_model < a.arch.d_model
    assert abs(param_count(b.arch).total - 400_000) < abs(
        param_count(b.arch.replace(vocab_size=256)).total - 400_000
    )


@pytest.mark.parametrize(
    ("training", "field", "reason"),
    [
        (
            {"tokenizer": {"kind": "bpe", "vocab_size": 100}},
            "training.tokenizer.bpe.vocab_size",
            "",
        ),
        ({"tokenizer": {"kind": "wordpiece"}}, "training.tokenizer", ""),
        ({"tokenizer": {"kind": "bpe"}}, "training.tokenizer.bpe.vocab_size", ""),
        (
            {"tokenizer": {"kind": "bpe", "vocab_size": 2048}, "vocab_size": 512},
            "training",
            "a BPE's vocabulary is the model's",
        ),
        ({"text_field": ""}, "training.text_field", ""),
    ],
)
def test_bad_tokenizers_are_refused_naming_the_field(
    training: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(TINY | {"training": TINY["training"] | training})
    assert any(f == field and reason in r for f, r in info.value.errors), info.value.errors


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_a_bpe_job_on_a_jsonl_corpus(sqlite_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = [json.dumps({"body": f"line {i}: " + TEXT[: 200 + i]}) for i in range(60)]
    (data / "c.jsonl").write_text("\n".join(lines) + "\n")
    settings, Session = setup(sqlite_url, data_dir=data)
    extra = {"corpus": "c.jsonl", "text_field": "body"}
    spec = bpe_spec(**extra) | {"n_trials": 2}
    spec["training"]["tokenizer"] = {"kind": "bpe", "vocab_size": 512}  # type: ignore[index]
    job = submit(Session, settings, spec)
    Runner(settings).run(timeout_s=300)
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 2
    for t in trials:
        assert t.state == TrialState.COMPLETE, t.user_attrs
        run = t.user_attrs["train"][0]
        assert run["corpus"]["tokenizer"] == "bpe" and run["corpus"]["vocab_size"] == 512
        assert len(run["corpus"]["tokenizer_sha256"]) == 64
        assert run["final_val_bpb"] < run["final_val_loss"] / math.log(2)
        assert (
            t.user_attrs["costs"]["params"] == param_count(ArchConfig(**t.user_attrs["arch"])).total
        )


def test_the_dashboard_catalogue_and_analyses_know_val_bpb(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from nas_service.api.analysis import parse_metrics
    from nas_service.api.app import create_app
    from nas_service.settings import get_settings

    app = create_app(get_settings(database_url=f"sqlite:///{tmp_path / 'c.db'}"))
    with TestClient(app) as c:
        metrics = c.get("/v1/catalogue").json()["metrics"]
    assert metrics["val_bpb"]["unit"] == "bits/byte"
    assert parse_metrics("val_bpb, params") == ["val_bpb", "params"]
