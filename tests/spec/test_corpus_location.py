"""The corpus a job's workers read: located in the data folder by the service's check
(`locate_corpus`), carried in the `TrainSpec` as a path relative to the data folder, read
beneath it with no link followed, and recorded without the server's own path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nas_service.search.pricing import price_candidate
from nas_service.settings import get_settings
from nas_service.spec import CorpusLocation, locate_corpus, parse_spec
from tests.support.hostile import with_
from workers.data import CorpusError
from workers.train import train

TEXT = "to be or not to be, that is the question\n" * 400
PARAMS = {"residual": "baseline", "n_layers": 2, "d_model": 64}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "shelf").mkdir(parents=True)
    (root / "shelf" / "plays.txt").write_text(TEXT)
    (root / "inner").symlink_to(root / "shelf" / "plays.txt")  # a link that stays inside
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" * 400)
    return root


def tiny(location: CorpusLocation | None) -> object:
    spec = parse_spec(with_(("training.corpus", "shelf/plays.txt")))
    priced = price_candidate(spec, PARAMS, corpus=location)
    assert priced.train_spec is not None
    return priced.train_spec.replace(
        budget_flops=None, budget_tokens=8 * 64 * 2, n_evals=1, eval_batches=1
    )


def test_the_workers_read_the_corpus_relative_to_the_data_folder(data_dir: Path) -> None:
    settings = get_settings(data_dir=data_dir)
    root = os.path.realpath(data_dir)
    assert locate_corpus(None, settings) is None
    assert locate_corpus("shelf/plays.txt", settings) == CorpusLocation(root, "shelf/plays.txt")
    assert locate_corpus("inner", settings) == CorpusLocation(root, "shelf/plays.txt")
    spec = tiny(locate_corpus("shelf/plays.txt", settings))
    assert (spec.corpus, spec.corpus_root) == ("shelf/plays.txt", root)  # type: ignore[attr-defined]
    result = train(spec)  # type: ignore[arg-type]
    assert result.corpus["source"] == "shelf/plays.txt"  # what /trials serves
    assert result.corpus["n_tokens"] == len(TEXT)
    assert str(data_dir) not in str(result.corpus) and root not in str(result.corpus)


def test_a_name_swapped_for_a_link_after_the_check_is_refused(
    data_dir: Path, tmp_path: Path
) -> None:
    """The check passes, then the file becomes a link to a file outside: the run is refused
    naming the path inside the data folder, and nothing outside is read."""
    spec = tiny(locate_corpus("shelf/plays.txt", get_settings(data_dir=data_dir)))
    target = data_dir / "shelf" / "plays.txt"
    target.unlink()
    target.symlink_to(tmp_path / "passwd")
    with pytest.raises(CorpusError) as info:
        train(spec)  # type: ignore[arg-type]
    assert "'shelf/plays.txt'" in info.value.reason and "symbolic link" in info.value.reason
    assert str(data_dir) not in info.value.reason
