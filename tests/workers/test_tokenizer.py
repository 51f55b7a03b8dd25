"""The byte-level BPE: trained on the training documents only, cached by the corpus identity
and vocabulary, its hash in the corpus identity, and bits per byte counted in real bytes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cost_model import ArchConfig, param_count
from workers import tokenizer
from workers.contract import TrainSpec, TrainSpecError
from workers.data import CorpusError, assign_documents, load_corpus
from workers.train import initial_model, train

TRAIN_WORD, VAL_WORD = "wvbnmk", "zqxjgy"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv(tokenizer.CACHE_ENV, str(cache))
    tokenizer.forget_cached()
    return cache


def corpus_file(folder: Path) -> Path:
    """A JSONL corpus whose validation records alone hold VAL_WORD, train ones TRAIN_WORD."""
    ids = [f"c.jsonl:{i}" for i in range(80)]
    flags = assign_documents(ids, 0.1)
    assert any(flags) and not all(flags)
    lines = []
    for i, val in enumerate(flags):
        word = VAL_WORD if val else TRAIN_WORD
        text = f"record {i} says " + " ".join([word] * 40) + " and the rest is prose. " * 8
        lines.append(json.dumps({"text": text}))
    path = folder / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_no_validation_text_reaches_the_tokenizer(tmp_path: Path) -> None:
    path = corpus_file(tmp_path)
    corpus = load_corpus(path, tokenizer="bpe", tokenizer_vocab=2048)
    vocab = json.loads(tokenizer._memory[next(iter(tokenizer._memory))].json)["model"]["vocab"]
    assert any(TRAIN_WORD in t for t in vocab)  # a train word repeated becomes a token
    assert not any(VAL_WORD[:3] in t for t in vocab)  # the validation one never merges
    assert corpus.info.tokenizer == "bpe" and len(corpus.info.tokenizer_sha256) == 64
    assert corpus.info.vocab_size == 2048
    # the tokens stand for the text's bytes exactly
    assert corpus.token_bytes is not None
    byte = load_corpus(path)
    assert int(corpus.token_bytes[corpus.val].sum()) == byte.info.n_val_tokens
    assert int(corpus.token_bytes[corpus.train].sum()) == byte.info.n_train_tokens
    assert corpus.info.n_tokens < byte.info.n_tokens / 2


def test_cached_by_corpus_and_vocabulary(tmp_path: Path, private_cache: Path) -> None:
    path = corpus_file(tmp_path)
    a = load_corpus(path, tokenizer="bpe", tokenizer_vocab=2048)
    files = sorted(p.name for p in private_cache.iterdir())
    assert len(files) == 1 and files[0].endswith("-2048.json")
    tokenizer.forget_cached()
    b = load_corpus(path, tokenizer="bpe", tokenizer_vocab=2048)  # from the folder's cache
    assert b.info == a.info
    c = load_corpus(path, tokenizer="bpe", tokenizer_vocab=261)
    assert c.info.tokenizer_sha256 != a.info.tokenizer_sha256
    assert len(list(private_cache.iterdir())) == 2
    (private_cache / files[0]).write_text("damaged")
    tokenizer.forget_cached()
    assert load_corpus(path, tokenizer="bpe", tokenizer_vocab=2048).info == a.info


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"tokenizer": "sentencepiece"}, "tokenizer"),
        ({"tokenizer": "bpe"}, "tokenizer.vocab_size"),
        ({"tokenizer": "bpe", "tokenizer_vocab": 100}, "tokenizer.vocab_size"),
    ],
)
def test_bad_tokenizer_requests_name_the_field(
    tmp_path: Path, kw: dict[str, object], field: str
) -> None:
    with pytest.raises(CorpusError) as info:
        load_corpus(corpus_file(tmp_path), **kw)  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_token_file_takes_no_bpe(tmp_path: Path) -> None:
    np.arange(1000, dtype="<u2").tofile(tmp_path / "t.u16")
    with pytest.raises(CorpusError, match="holds tokens already"):
        load_corpus(tmp_path / "t.u16", tokenizer="bpe", tokenizer_vocab=512)


def test_a_bpe_job_trains_with_the_cost_model_parameters(tmp_path: Path) -> None:
    path = corpus_file(tmp_path)
    arch = ArchConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32, vocab_size=2048)
    spec = TrainSpec(
        arch=arch,
        budget_tokens=8 * 32 * 6,
        batch_size=8,
        threads=1,
        n_evals=2,
        corpus=str(path),
        tokenizer="bpe",
        tokenizer_vocab=2048,
    )
    model = initial_model(spec)
    assert sum(p.numel() for p in model.parameters()) == param_count(arch).total
    result = train(spec)
    assert result.params == param_count(arch).total
    assert result.corpus["tokenizer"] == "bpe" and result.corpus["vocab_size"] == 2048
    assert math.isfinite(result.final_val_bpb)
    # more than one byte per token: bits per byte is below the per-token loss over ln 2
    assert result.final_val_bpb < result.final_val_loss / math.log(2)
    with pytest.raises(TrainSpecError, match="tokenizer_vocab"):
        spec.replace(tokenizer_vocab=1024)
