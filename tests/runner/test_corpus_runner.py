"""A job whose corpus is a file in the data folder, run by the runner on a local Ray: the
workers read it beneath the data folder, and every run records it by its path inside the
data folder, never by the server's own path."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from nas_service.jobs import submit
from nas_service.runner.loop import Runner
from tests.support.jobs import TINY, counted, setup, study_of

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.usefixtures("ray_local"),
]

TEXT = "to be or not to be, that is the question\n" * 400


def test_a_data_folder_corpus_is_recorded_relative_to_it(sqlite_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "shelf").mkdir(parents=True)
    (data / "shelf" / "plays.txt").write_text(TEXT)
    settings, Session = setup(sqlite_url, data_dir=data)
    spec = TINY | {"n_trials": 2, "training": TINY["training"] | {"corpus": "shelf/plays.txt"}}
    job = submit(Session, settings, spec)
    Runner(settings).run(timeout_s=300)
    trials = counted(study_of(sqlite_url, job))
    assert len(trials) == 2
    for t in trials:
        assert t.state == TrialState.COMPLETE, t.user_attrs
        corpus = t.user_attrs["train"][0]["corpus"]
        assert corpus["source"] == "shelf/plays.txt" and corpus["name"] == "plays.txt"
        assert corpus["n_tokens"] == len(TEXT)
        assert str(tmp_path) not in str(corpus)
