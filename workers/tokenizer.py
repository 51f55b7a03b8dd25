"""A byte-level BPE tokenizer trained locally on a corpus's training documents.

`training.tokenizer: {kind: bpe, vocab_size: N}` trains one with Hugging Face `tokenizers`
(the `corpora` extra) on the training documents only, never the validation ones, and never
downloads anything: the tokenizer is built from its model, pre-tokenizer and trainer here and
kept as its own JSON. It is cached by the corpus identity (the byte-level split's checksum)
and the vocabulary size, in this process and in a folder (`DEPTHSCOPE_TOKENIZER_CACHE`, by
default `~/.cache/depthscope/tokenizers`), and its sha256 (of that JSON) joins the corpus
identity every run records.

Byte-level: every string is first mapped to its UTF-8 bytes (one alphabet character per
byte), so every text is encodable and each token stands for a whole number of bytes
(`token_bytes`), which is what bits per byte counts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workers.data_errors import CorpusError

log = logging.getLogger(__name__)

TOKENIZERS = ("byte", "bpe")
MIN_BPE_VOCAB = 260  # the 256 bytes and at least a few merges
MAX_BPE_VOCAB = 1 << 17
CACHE_ENV = "DEPTHSCOPE_TOKENIZER_CACHE"

_lock = threading.Lock()
_memory: dict[tuple[str, int], BpeTokenizer] = {}


@dataclass(frozen=True, eq=False)
class BpeTokenizer:
    """A trained tokenizer: its JSON, that JSON's sha256, each id's byte length, and how
    long it took to train (0 when it came from a cache)."""

    json: str
    sha256: str
    token_bytes: np.ndarray
    train_seconds: float

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """The ids of `texts`, concatenated (uint16 when they fit, else uint32)."""
        tok = _tokenizer_from(self.json)
        dtype = np.uint16 if self.vocab_size <= 1 << 16 else np.uint32
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: 2× faster
        parts = [np.asarray(e.ids, dtype=dtype) for e in encode(list(texts))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise CorpusError(
            "tokenizer", "kind bpe needs the tokenizers package (install depthscope[corpora])"
        ) from None
    return tokenizers


def _tokenizer_from(text: str) -> Any:
    return _tokenizers().Tokenizer.from_str(text)


def check_vocab(vocab_size: int) -> None:
    if not MIN_BPE_VOCAB <= vocab_size <= MAX_BPE_VOCAB:
        raise CorpusError(
            "tokenizer.vocab_size",
            f"must be between {MIN_BPE_VOCAB} and {MAX_BPE_VOCAB}, got {vocab_size}",
        )


def train_bpe(texts: Sequence[str], vocab_size: int) -> BpeTokenizer:
    """A byte-level BPE of at most `vocab_size` ids trained on `texts` (and nothing else)."""
    check_vocab(vocab_size)
    tk = _tokenizers()
    start = time.perf_counter()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    seconds = time.perf_counter() - start
    return _made(tok.to_str(), seconds)


def _made(text: str, seconds: float) -> BpeTokenizer:
    tok = _tokenizer_from(text)
    n = tok.get_vocab_size()
    lengths = np.zeros(n, dtype=np.int64)
    for token, i in tok.get_vocab().items():
        lengths[i] = len(token)  # one alphabet character per byte
    lengths.setflags(write=False)
    return BpeTokenizer(text, hashlib.sha256(text.encode()).hexdigest(), lengths, seconds)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/depthscope/tokenizers").expanduser()


def bpe_for(key: str, vocab_size: int, train_texts: Sequence[str]) -> BpeTokenizer:
    """The tokenizer of the corpus whose identity is `key` at `vocab_size`: from this
    process's cache, else the folder's, else trained on `train_texts` and cached in both."""
    check_vocab(vocab_size)
    with _lock:
        found = _memory.get((key, vocab_size))
        if found is not None:
            return found
        path = cache_dir() / f"bpe-{key}-{vocab_size}.json"
        tok = None
        try:
            tok = _made(path.read_text(encoding="utf-8"), 0.0)
        except Exception as exc:  # absent or damaged (tokenizers raises Exception): train anew
            if path.exists():
                log.warning("ignoring the cached tokenizer %s: %s", path.name, exc)
        if tok is None:
            tok = train_bpe(train_texts, vocab_size)
            log.info("trained a %d-id BPE in %.2f s", tok.vocab_size, tok.train_seconds)
            _store(path, tok.json)
        _memory[key, vocab_size] = tok
        return tok


def _store(path: Path, text: str) -> None:
    """Write the cache file atomically; a cache that cannot be written is only logged."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bpe-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot cache the tokenizer in %s: %s", path.parent, exc)


def forget_cached() -> None:
    """Empty this process's cache (tests)."""
    with _lock:
        _memory.clear()
