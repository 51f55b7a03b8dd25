"""Corpora and tokenizers through the runner: every trial records `val_bpb` (its validation
loss in bits per UTF-8 byte of text) beside `val_loss`, which can be an objective and is a
metric of the analyses; a corpus of raw tokens has no bytes, so val_bpb as an objective fails
its trials with the reason instead of telling Optuna a NaN."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from nas_service.jobs import submit
from nas_service.results import _row
from nas_service.runner import Runner
from tests.service.jobkit import TINY, counted, setup, study_of

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.usefixtures("ray_local"),
]

TEXT = "to be or not to be, that is the question\n" * 400


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


def test_val_loss_jobs_record_val_bpb_as_a_metric(sqlite_url: str) -> None:
    settings, Session = setup(sqlite_url)
    job = submit(Session, settings, TINY | {"n_trials": 1})
    Runner(settings).run(timeout_s=300)
    (t,) = counted(study_of(sqlite_url, job))
    assert t.state == TrialState.COMPLETE, t.user_attrs
    row = _row(t, ["val_loss"], None)
    assert row.metrics["val_bpb"] == pytest.approx(row.metrics["val_loss"] / math.log(2))


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
