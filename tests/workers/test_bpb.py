"""Bits per byte: every run reports its validation loss per UTF-8 byte of validation text."""

from __future__ import annotations

import math

import pytest

from cost_model import ArchConfig
from nas_service.search.study import train_summary
from workers.contract import TrainSpec
from workers.data import Corpus, load_corpus
from workers.train import train

TINY = ArchConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus(max_bytes=2**20)


def test_byte_tokenizer_bpb_is_loss_over_ln2(corpus: Corpus) -> None:
    spec = TrainSpec(arch=TINY, budget_tokens=8 * 32 * 12, batch_size=8, threads=1, n_evals=3)
    result = train(spec, corpus=corpus)
    assert result.curve
    for point in result.curve:
        assert point.val_bpb == pytest.approx(point.val_loss / math.log(2), rel=1e-12)
    assert result.final_val_bpb == pytest.approx(result.final_val_loss / math.log(2), rel=1e-12)
    assert result.best_val_bpb == pytest.approx(result.best_val_loss / math.log(2), rel=1e-12)
    summary = train_summary(result)
    assert summary["final_val_bpb"] == pytest.approx(result.final_val_loss / math.log(2))
    assert summary["best_val_bpb"] == pytest.approx(result.best_val_loss / math.log(2))


def test_token_file_has_no_bytes_so_no_bpb(tmp_path: object) -> None:
    from pathlib import Path

    import numpy as np

    path = Path(str(tmp_path)) / "tokens.u16"
    np.arange(4000, dtype="<u2").__mod__(200).astype("<u2").tofile(path)
    corpus = load_corpus(path)
    assert corpus.token_bytes is None
    spec = TrainSpec(arch=TINY, budget_tokens=8 * 32 * 4, batch_size=8, threads=1, n_evals=2)
    result = train(spec, corpus=corpus)
    assert math.isfinite(result.final_val_loss)
    assert math.isnan(result.final_val_bpb)
    assert train_summary(result)["final_val_bpb"] is None
