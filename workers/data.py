"""Corpora for training candidates: the built-in default and user-supplied files.

Conventions:
- Text is tokenised at the byte level: one token per UTF-8 byte, vocab 256, stored as uint16.
- A corpus is a list of documents (files, or 64 KiB chunks of a single file). A document goes
  wholly to validation or wholly to train, decided by a stable hash of its id alone, so the
  same documents are always in validation and no text leaks across the split.
- Pre-tokenised files (`.bin`, `.u16`, `.u32`, or an explicit `token_dtype`) hold raw
  little-endian tokens with no documents: validation is their contiguous tail.
- Token arrays are read-only 1-D numpy arrays; batches are int64 CPU tensors.
- Every problem raises `CorpusError(field, reason)`, whose message names the path.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import platform
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.corpus_documents import CHUNK_BYTES as CHUNK_BYTES
from workers.corpus_documents import DEFAULT_BUILTIN_BYTES as DEFAULT_BUILTIN_BYTES
from workers.corpus_documents import beneath_documents, chunks, file_documents, folder_documents
from workers.corpus_documents import stdlib_documents as stdlib_documents
from workers.corpus_files import (
    check_regular,
    file_of,
    open_beneath,
    open_regular,
    read_text,
    rel_parts,
    text_of,
)
from workers.data_errors import CorpusError, Document
from workers.data_records import (
    DEFAULT_TEXT_FIELD,
    is_record_file,
)
from workers.tokenizer import TOKENIZERS, bpe_for, check_vocab

__all__ = ["BUILTIN", "Corpus", "CorpusError", "CorpusInfo", "Document", "load_corpus"]

log = logging.getLogger(__name__)

BUILTIN = "builtin"
BYTE_VOCAB = 256
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
TOKEN_SUFFIXES = {".bin": "uint16", ".u16": "uint16", ".u32": "uint32"}  # .bin: nanoGPT's


@dataclass(frozen=True)
class CorpusInfo:
    """The identity of a corpus, recorded in every training result.

    `checksum` is the sha256 hex of the token dtype and split sizes followed by the train
    tokens then the validation tokens (little-endian bytes), so the same tokens split
    differently have a different checksum.
    """

    name: str
    checksum: str
    n_tokens: int
    n_train_tokens: int
    n_val_tokens: int
    vocab_size: int
    source: str
    #: "byte" (one token per UTF-8 byte) or "bpe" (`workers.tokenizer`), and the BPE's
    #: sha256 (of its JSON; "" for bytes): part of the identity every run records
    tokenizer: str = "byte"
    tokenizer_sha256: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Corpus:
    """Train and validation tokens (read-only 1-D arrays) with their `CorpusInfo`.

    `token_bytes[t]` is the number of UTF-8 bytes of text token id t stands for (all ones
    for byte tokens); None for pre-tokenised files, whose text is unknown (no bits per byte).
    """

    train: np.ndarray
    val: np.ndarray
    info: CorpusInfo
    token_bytes: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        """Tokens are in [0, vocab_size)."""
        return self.info.vocab_size

    def split(self, name: str) -> np.ndarray:
        """The token array of split `name` ("train" or "val")."""
        if name == "train":
            return self.train
        if name == "val":
            return self.val
        raise CorpusError("split", f"must be 'train' or 'val', got {name!r}")

    def check_fits(self, batch_size: int, seq_len: int) -> None:
        """Raise unless both splits hold at least one window of `seq_len` + 1 tokens."""
        if batch_size < 1:
            raise CorpusError("batch_size", f"must be at least 1, got {batch_size}")
        if seq_len < 1:
            raise CorpusError("seq_len", f"must be at least 1, got {seq_len}")
        for name in ("train", "val"):
            n = len(self.split(name))
            if n < seq_len + 1:
                raise CorpusError(
                    "seq_len",
                    f"the {name} split of {self.info.source} holds {n} tokens; "
                    f"seq_len {seq_len} needs at least {seq_len + 1}",
                )

    def batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, int64 (B, T), from random offsets drawn with the
        (CPU) `generator`: the same generator state gives the same batch."""
        self.check_fits(batch_size, seq_len)
        data = self.split(split)
        offsets = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
        return _windows(data, offsets.numpy(), seq_len)

    def eval_batches(
        self, batch_size: int, seq_len: int, n_batches: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A fixed list of validation batches at evenly spaced offsets spanning the whole
        split (first offset 0, last at the end), so every candidate sees the same tokens."""
        self.check_fits(batch_size, seq_len)
        if n_batches < 1:
            raise CorpusError("n_batches", f"must be at least 1, got {n_batches}")
        last = len(self.val) - seq_len - 1
        offsets = np.linspace(0, last, num=batch_size * n_batches).round().astype(np.int64)
        return [
            _windows(self.val, offsets[i * batch_size : (i + 1) * batch_size], seq_len)
            for i in range(n_batches)
        ]

    def tokens_per_byte(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
        """Target tokens per UTF-8 byte of the text they stand for, over `batches` (None
        when the corpus has no text: a token file). A loss in nats per token times this,
        over ln 2, is bits per byte."""
        if self.token_bytes is None:
            return None
        n_tokens = sum(int(y.numel()) for _, y in batches)
        n_bytes = sum(int(self.token_bytes[y.numpy()].sum()) for _, y in batches)
        return n_tokens / n_bytes if n_bytes else None


def _windows(
    data: np.ndarray, offsets: np.ndarray, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len + 1 tokens at `offsets`, as (inputs, targets shifted by one)."""
    index = offsets[:, None] + np.arange(seq_len + 1)  # (B, T + 1)
    window = torch.from_numpy(data[index].astype(np.int64))  # (B, T + 1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def is_validation(doc_id: str, val_fraction: float) -> bool:
    """The hash rule: sha256(doc_id) mod 1000 < val_fraction * 1000. Depends on the id only."""
    return _bucket(doc_id) < round(val_fraction * 1000)


def _bucket(doc_id: str) -> int:
    return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") % 1000


def assign_documents(doc_ids: Sequence[str], val_fraction: float) -> list[bool]:
    """True for each document in validation. Follows `is_validation`, except that with two or
    more documents both splits are made non-empty: if none is in validation, the one with the
    lowest bucket moves there; if all are, the one with the highest bucket moves to train."""
    flags = [is_validation(d, val_fraction) for d in doc_ids]
    if len(flags) >= 2 and (all(flags) or not any(flags)):
        pick = (max if all(flags) else min)(range(len(flags)), key=lambda i: _bucket(doc_ids[i]))
        flags[pick] = not flags[pick]
    return flags


def _load_beneath(
    root: str,
    source: str,
    dtype_name: str | None,
    val_fraction: float,
    max_bytes: int | None,
    vocab_size: int | None,
    text_field: str = DEFAULT_TEXT_FIELD,
) -> Corpus:
    """`load_corpus` of `source`, a path relative to the folder `root`, opened once beneath
    it without following a link (`_open_beneath`); the descriptor is what is read."""
    parts = rel_parts(source)
    shown = "/".join(parts)
    name = parts[-1]
    fd, st = open_beneath(root, parts)
    if dtype_name is not None:
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise CorpusError("corpus", f"{shown!r} is a folder; token_dtype needs one token file")
        tokens = _tokens_of(fd, repr(shown), st.st_size, dtype_name, max_bytes)
        return _token_corpus(tokens, val_fraction, name=name, source=shown, vocab_size=vocab_size)
    if stat.S_ISDIR(st.st_mode):
        try:
            docs = beneath_documents(fd, shown, max_bytes, text_field)
        finally:
            os.close(fd)
    elif is_record_file(name):
        docs = file_documents(fd, repr(shown), name, text_field, max_bytes)
    else:
        docs = chunks(text_of(fd, repr(shown), max_bytes))
    return _text_corpus(docs, val_fraction, name=name, source=shown, vocab_size=vocab_size)


def _split_documents(
    docs: Sequence[Document], val_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Byte tokens of the train and validation documents. A single document is split
    contiguously instead: its last `val_fraction` goes to validation."""
    if len(docs) == 1:
        data = docs[0].data
        n_val = max(1, round(len(data) * val_fraction))
        return _bytes_tokens(data[:-n_val]), _bytes_tokens(data[-n_val:])
    flags = assign_documents([d.doc_id for d in docs], val_fraction)
    train = b"".join(d.data for d, v in zip(docs, flags, strict=True) if not v)
    val = b"".join(d.data for d, v in zip(docs, flags, strict=True) if v)
    return _bytes_tokens(train), _bytes_tokens(val)


def _bytes_tokens(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)


def _read_tokens(path: Path, dtype_name: str, max_bytes: int | None) -> np.ndarray:
    """Raw little-endian tokens of `path` (the first `max_bytes // itemsize` if given)."""
    if path.is_dir():
        raise CorpusError("corpus", f"{path} is a folder; token_dtype needs one token file")
    check_regular(path)
    fd = open_regular(path, str(path))
    return _tokens_of(fd, str(path), os.fstat(fd).st_size, dtype_name, max_bytes)


def _tokens_of(
    fd: int, shown: str, size: int, dtype_name: str, max_bytes: int | None
) -> np.ndarray:
    """The tokens read from the open descriptor `fd` (closed here) of `size` bytes."""
    dtype = TOKEN_DTYPES[dtype_name]
    if size % dtype.itemsize:
        os.close(fd)
        raise CorpusError(
            "corpus",
            f"{shown} holds {size} bytes, not a multiple of {dtype.itemsize} ({dtype_name})",
        )
    count = -1 if max_bytes is None else max_bytes // dtype.itemsize
    try:
        with file_of(fd, shown) as f:
            return np.fromfile(f, dtype=dtype, count=count)
    except OSError as e:
        raise CorpusError("corpus", f"cannot read {shown}: {e.strerror or e}") from e


def _token_corpus(
    tokens: np.ndarray, val_fraction: float, *, name: str, source: str, vocab_size: int | None
) -> Corpus:
    n_val = min(len(tokens), max(1, round(len(tokens) * val_fraction)))
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    return _make_corpus(train, val, name=name, source=source, vocab_size=vocab_size)


def _text_corpus(
    docs: list[Document], val_fraction: float, *, name: str, source: str, vocab_size: int | None
) -> Corpus:
    if not docs:
        raise CorpusError("corpus", f"{source} holds no tokens")
    train, val = _split_documents(docs, val_fraction)
    corpus = _make_corpus(train, val, name=name, source=source, vocab_size=vocab_size or BYTE_VOCAB)
    return _with_byte_lengths(corpus)


def _with_byte_lengths(corpus: Corpus) -> Corpus:
    """`corpus` with byte tokens' lengths: one byte each (ids above 255, in a larger
    vocabulary than the bytes, never occur)."""
    lengths = np.ones(corpus.vocab_size, dtype=np.int64)
    lengths.setflags(write=False)
    return dataclasses.replace(corpus, token_bytes=lengths)


def _make_corpus(
    train: np.ndarray, val: np.ndarray, *, name: str, source: str, vocab_size: int | None
) -> Corpus:
    """Validate the two splits, compute the checksum and freeze the arrays."""
    if len(train) == 0 and len(val) == 0:
        raise CorpusError("corpus", f"{source} holds no tokens")
    if len(train) == 0 or len(val) == 0:
        raise CorpusError("corpus", f"{source} holds too few tokens to split (need at least 2)")
    needed = int(max(train.max(), val.max())) + 1
    if vocab_size is not None and vocab_size < needed:
        raise CorpusError("vocab_size", f"{vocab_size} is below {needed}, needed by {source}")
    digest = hashlib.sha256(f"{train.dtype.str}:{len(train)}:{len(val)}\n".encode())
    for arr in (train, val):
        digest.update(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes())
        arr.setflags(write=False)
    info = CorpusInfo(
        name=name,
        checksum=digest.hexdigest(),
        n_tokens=len(train) + len(val),
        n_train_tokens=len(train),
        n_val_tokens=len(val),
        vocab_size=vocab_size or needed,
        source=source,
    )
    log.info("corpus %s: %d tokens (%d train, %d val)", name, info.n_tokens, len(train), len(val))
    return Corpus(train, val, info)


@functools.lru_cache(maxsize=4)
def _builtin_corpus(max_bytes: int, val_fraction: float, vocab_size: int) -> Corpus:
    """The built-in corpus, tokenised once per process (its arrays are read-only)."""
    start = time.perf_counter()
    docs = stdlib_documents(max_bytes)
    if not docs:
        raise CorpusError("corpus", f"no standard library file fits in max_bytes={max_bytes}")
    train, val = _split_documents(docs, val_fraction)
    name = f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}"
    source = f"{BUILTIN}:python-stdlib-{platform.python_version()}"  # no machine path
    corpus = _with_byte_lengths(
        _make_corpus(train, val, name=name, source=source, vocab_size=vocab_size)
    )
    log.info("built-in corpus loaded in %.2f s", time.perf_counter() - start)
    return corpus


def load_corpus(
    source: str | os.PathLike[str] | None = None,
    *,
    val_fraction: float = 0.1,
    max_bytes: int | None = None,
    token_dtype: str | None = None,
    vocab_size: int | None = None,
    root: str | None = None,
    text_field: str = DEFAULT_TEXT_FIELD,
    tokenizer: str = "byte",
    tokenizer_vocab: int | None = None,
) -> Corpus:
    """Load a corpus and split it into train and validation.

    `source`: None or "builtin" (the standard library's sources, cached per process; a
    folder named "builtin" is reached as "./builtin"), a UTF-8 text file (64 KiB chunks are
    its documents), a folder (its files are the documents), or a token file (`.bin`/`.u16`
    uint16, `.u32` uint32, or any file with `token_dtype`), a record file (`.jsonl`,
    `.parquet`: each record's `text_field` a document; `workers.data_records`), or a dataset
    saved by `datasets.save_to_disk` (a folder with its `state.json`). `max_bytes` caps
    what is read (default: ≈ 8 MiB for the built-in corpus, everything otherwise).
    `vocab_size` defaults to 256 for text and max token + 1 for token files; a smaller one
    is an error.

    With `root` (the service's data folder), `source` is a path relative to it, opened once
    beneath it with no symbolic link followed at any component (a link, `..`, an absolute
    path, a FIFO or a device is refused); the descriptor opened is the one checked and read,
    so swapping a name for a link between a check and the read changes nothing. Messages and
    `CorpusInfo.source` name the path relative to `root`.

    `tokenizer`: "byte" (the default) or "bpe": a byte-level BPE of `tokenizer_vocab` ids
    trained on the train split's text only (`workers.tokenizer`, cached by the byte-level
    corpus's checksum and the vocabulary); the model's vocabulary is then `tokenizer_vocab`.
    """
    if tokenizer not in TOKENIZERS:
        raise CorpusError("tokenizer", f"unknown kind {tokenizer!r}; expected byte or bpe")
    if tokenizer == "byte":
        return _load_bytes(
            source, val_fraction, max_bytes, token_dtype, vocab_size, root, text_field
        )
    if tokenizer_vocab is None:
        raise CorpusError("tokenizer.vocab_size", "kind bpe needs a vocabulary size")
    check_vocab(tokenizer_vocab)
    byte = _load_bytes(source, val_fraction, max_bytes, token_dtype, None, root, text_field)
    if byte.token_bytes is None:
        raise CorpusError(
            "tokenizer", f"{byte.info.source} holds tokens already; only text takes a BPE"
        )
    return _bpe_corpus(byte, tokenizer_vocab)


def _bpe_corpus(byte: Corpus, vocab: int) -> Corpus:
    """The text of the byte-level `byte` retokenised by the BPE trained on its train split."""
    train_texts, val_texts = _texts(byte.train), _texts(byte.val)
    tok = bpe_for(byte.info.checksum, vocab, train_texts)  # never sees val_texts
    corpus = _make_corpus(
        tok.encode(train_texts),
        tok.encode(val_texts),
        name=byte.info.name,
        source=byte.info.source,
        vocab_size=vocab,
    )
    lengths = np.zeros(vocab, dtype=np.int64)
    lengths[: tok.vocab_size] = tok.token_bytes
    lengths.setflags(write=False)
    info = dataclasses.replace(corpus.info, tokenizer="bpe", tokenizer_sha256=tok.sha256)
    return Corpus(corpus.train, corpus.val, info, lengths)


def _texts(tokens: np.ndarray) -> list[str]:
    """The text of byte tokens, in pieces of about `CHUNK_BYTES` ending after a newline
    (a byte sequence cut inside a character, at a single file's split, becomes U+FFFD)."""
    data = tokens.astype(np.uint8).tobytes()
    out, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start + CHUNK_BYTES)
        end = len(data) if end < 0 else end + 1
        out.append(data[start:end].decode("utf-8", errors="replace"))
        start = end
    return out


def _load_bytes(
    source: str | os.PathLike[str] | None,
    val_fraction: float,
    max_bytes: int | None,
    token_dtype: str | None,
    vocab_size: int | None,
    root: str | None,
    text_field: str,
) -> Corpus:
    """`load_corpus` with byte tokens."""
    if not 0 < val_fraction <= 0.5:  # also rejects NaN
        raise CorpusError("val_fraction", f"must be in (0, 0.5], got {val_fraction}")
    if token_dtype is not None and token_dtype not in TOKEN_DTYPES:
        known = ", ".join(TOKEN_DTYPES)
        raise CorpusError("token_dtype", f"unknown {token_dtype!r}; known: {known}")
    if max_bytes is not None and max_bytes < 1:
        raise CorpusError("max_bytes", f"must be at least 1, got {max_bytes}")
    if vocab_size is not None and vocab_size < 1:
        raise CorpusError("vocab_size", f"must be at least 1, got {vocab_size}")
    if not text_field or len(text_field) > 200:
        raise CorpusError("text_field", "must be a name of 1 to 200 characters")
    if source is None or (isinstance(source, str) and source == BUILTIN):
        if token_dtype is not None:
            raise CorpusError("token_dtype", "the built-in corpus is byte-level text")
        return _builtin_corpus(
            max_bytes or DEFAULT_BUILTIN_BYTES, val_fraction, vocab_size or BYTE_VOCAB
        )
    if root is not None:
        dtype_name = token_dtype or TOKEN_SUFFIXES.get(Path(str(source)).suffix.lower())
        return _load_beneath(
            root, str(source), dtype_name, val_fraction, max_bytes, vocab_size, text_field
        )
    path = Path(source).expanduser()
    shown = str(path)
    dtype_name = token_dtype or TOKEN_SUFFIXES.get(path.suffix.lower())
    if dtype_name is not None:
        tokens = _read_tokens(path, dtype_name, max_bytes)
        return _token_corpus(
            tokens, val_fraction, name=path.name, source=shown, vocab_size=vocab_size
        )
    if path.is_dir():
        docs = folder_documents(path, max_bytes, text_field)
    elif is_record_file(path.name):
        check_regular(path)
        docs = file_documents(open_regular(path, shown), shown, path.name, text_field, max_bytes)
    else:
        docs = chunks(read_text(path, max_bytes))
    return _text_corpus(docs, val_fraction, name=path.name, source=shown, vocab_size=vocab_size)
