"""workers.data: the built-in corpus, user corpora, document-disjoint splits, batches, errors."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from workers import corpus_files, data
from workers.contract import TrainSpecError
from workers.data import (
    Corpus,
    CorpusError,
    assign_documents,
    is_validation,
    load_corpus,
    stdlib_documents,
)


def checksum(corpus: Corpus) -> str:
    """The documented checksum, recomputed from the arrays."""
    t, v = corpus.train, corpus.val
    digest = hashlib.sha256(f"{t.dtype.str}:{len(t)}:{len(v)}\n".encode())
    digest.update(t.tobytes() + v.tobytes())
    return digest.hexdigest()


def token_file(path: Path, tokens: np.ndarray) -> Path:
    tokens.tofile(path)
    return path


def expect_error(field: str, *needles: str, **kwargs: object) -> None:
    """load_corpus(**kwargs) raises CorpusError on `field`, its message holding `needles`."""
    with pytest.raises(CorpusError) as info:
        load_corpus(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert str(info.value) == f"{field}: {info.value.reason}"
    for needle in needles:
        assert needle in str(info.value)


# --- the built-in corpus -------------------------------------------------------------------


def test_builtin_corpus_is_real_byte_text() -> None:
    corpus = load_corpus()
    info = corpus.info
    assert info.name == f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}"
    assert corpus.vocab_size == info.vocab_size == 256
    assert corpus.train.dtype == corpus.val.dtype == np.uint16
    assert info.n_tokens > 1_000_000
    assert info.n_tokens <= data.DEFAULT_BUILTIN_BYTES
    assert info.n_train_tokens == len(corpus.train) > 0
    assert info.n_val_tokens == len(corpus.val) > 0
    assert info.n_tokens == len(corpus.train) + len(corpus.val)
    assert 0.03 < info.n_val_tokens / info.n_tokens < 0.25  # about val_fraction = 0.1
    assert info.checksum == checksum(corpus)
    assert b"def " in corpus.train[:100_000].astype(np.uint8).tobytes()
    assert not corpus.train.flags.writeable  # shared through the per-process cache
    assert info.as_dict() == {
        "name": info.name,
        "checksum": info.checksum,
        "n_tokens": info.n_tokens,
        "n_train_tokens": info.n_train_tokens,
        "n_val_tokens": info.n_val_tokens,
        "vocab_size": 256,
        "source": info.source,
        "tokenizer": "byte",
        "tokenizer_sha256": "",
    }


def test_builtin_corpus_is_cached_and_reloads_identically() -> None:
    first = load_corpus("builtin", max_bytes=1_000_000)
    assert load_corpus(None, max_bytes=1_000_000) is first
    data._builtin_corpus.cache_clear()
    second = load_corpus(max_bytes=1_000_000)
    assert second is not first
    assert second.info == first.info
    assert np.array_equal(second.train, first.train)


def test_builtin_excludes_tests_and_caps_without_taking_the_alphabetical_prefix() -> None:
    everything = stdlib_documents(None)
    ids = [d.doc_id for d in everything]
    assert ids == sorted(ids)
    parts = {p for i in ids for p in i.split("/")[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    assert all(i.endswith(".py") for i in ids)
    capped = stdlib_documents(500_000)
    assert 2 <= len(capped) < len(everything)
    assert sum(len(d.data) for d in capped) <= 500_000
    prefix = ids[: len(capped)]
    assert [d.doc_id for d in capped] != prefix
    assert capped[-1].doc_id > ids[len(ids) // 2]  # reaches the second half of the alphabet
    for d in capped[:5]:
        assert d.data.startswith(f"# ==== {d.doc_id} ====\n".encode())


def test_builtin_split_is_document_disjoint() -> None:
    docs = stdlib_documents()
    flags = assign_documents([d.doc_id for d in docs], 0.1)
    assert any(flags) and not all(flags)
    corpus = load_corpus()
    train = corpus.train.astype(np.uint8).tobytes()
    val = corpus.val.astype(np.uint8).tobytes()
    assert train == b"".join(d.data for d, v in zip(docs, flags, strict=True) if not v)
    assert val == b"".join(d.data for d, v in zip(docs, flags, strict=True) if v)
    for d, v in zip(docs, flags, strict=True):
        header = f"# ==== {d.doc_id} ====\n".encode()
        assert (header in val) == v
        assert (header in train) == (not v)


def test_assignment_depends_on_each_id_alone_and_both_splits_are_non_empty() -> None:
    ids = [f"doc{i}.txt" for i in range(400)]
    flags = assign_documents(ids, 0.1)
    assert flags == [is_validation(i, 0.1) for i in ids]
    assert 20 < sum(flags) < 60
    assert assign_documents(ids[::-1], 0.1) == flags[::-1]
    train_only = [i for i, v in zip(ids, flags, strict=True) if not v][:3]
    forced = assign_documents(train_only, 0.1)
    assert sum(forced) == 1
    val_only = [i for i in ids if is_validation(i, 0.05)][:3]
    assert len(val_only) == 3
    assert assign_documents(val_only, 0.05).count(False) == 1
    assert assign_documents(["only"], 0.1) == [is_validation("only", 0.1)]


# --- batches -------------------------------------------------------------------------------


@pytest.fixture
def counting(tmp_path: Path) -> Corpus:
    """Tokens 0..9999 (uint32): a token's value is its offset in the file."""
    return load_corpus(token_file(tmp_path / "count.u32", np.arange(10_000, dtype=np.uint32)))


def test_batches_are_seeded_windows_with_shifted_targets(counting: Corpus) -> None:
    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return counting.batch("train", 8, 32, torch.Generator().manual_seed(seed))

    x, y = draw(0)
    assert x.shape == y.shape == (8, 32)
    assert x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.numpy(), y.numpy(), strict=True):
        offset = int(row_x[0])
        assert np.array_equal(row_x, counting.train[offset : offset + 32])
        assert np.array_equal(row_y, counting.train[offset + 1 : offset + 33])
    again = draw(0)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    assert not torch.equal(draw(1)[0], x)
    g = torch.Generator().manual_seed(0)
    assert not torch.equal(
        counting.batch("train", 8, 32, g)[0], counting.batch("train", 8, 32, g)[0]
    )
    vx, vy = counting.batch("val", 4, 8, torch.Generator().manual_seed(0))
    assert vx.min() >= 9_000 and vy.max() < 10_000  # the validation tail


def test_batch_offsets_reach_both_ends_without_overrun(tmp_path: Path) -> None:
    corpus = load_corpus(
        token_file(tmp_path / "t.u16", np.arange(40, dtype=np.uint16)), val_fraction=0.5
    )
    g = torch.Generator().manual_seed(3)
    x, y = corpus.batch("train", 512, 16, g)  # train holds 20 tokens: offsets 0..3
    assert set(x[:, 0].tolist()) == {0, 1, 2, 3}
    assert int(y.max()) == 19
    x, y = corpus.batch("val", 4, 19, g)  # exactly seq_len + 1 tokens: offset 0 only
    assert x[:, 0].tolist() == [20] * 4 and y[:, -1].tolist() == [39] * 4


def test_eval_batches_are_fixed_and_evenly_spaced(counting: Corpus) -> None:
    batches = counting.eval_batches(4, 16, 5)
    assert len(batches) == 5
    again = counting.eval_batches(4, 16, 5)
    for (x, y), (x2, y2) in zip(batches, again, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert x.shape == y.shape == (4, 16)
        assert torch.equal(x[:, 1:], y[:, :-1])
    starts = torch.cat([x[:, 0] for x, _ in batches]).numpy() - 9_000
    assert starts[0] == 0 and starts[-1] == len(counting.val) - 17
    assert np.ptp(np.diff(starts)) <= 1  # evenly spaced


# --- user corpora --------------------------------------------------------------------------


def test_small_text_file_is_split_by_its_tail(tmp_path: Path) -> None:
    text = "".join(f"line {i}: héllo wörld\n" for i in range(200)).encode()
    path = tmp_path / "notes.md"
    path.write_bytes(text)
    corpus = load_corpus(path)
    assert corpus.info.name == "notes.md" and str(path) in corpus.info.source
    assert corpus.vocab_size == 256 and corpus.info.n_tokens == len(text)
    n_val = round(len(text) * 0.1)
    assert corpus.val.astype(np.uint8).tobytes() == text[-n_val:]
    assert corpus.train.astype(np.uint8).tobytes() == text[:-n_val]
    assert corpus.info.checksum == checksum(corpus)
    path.write_bytes(text.replace(b"line 7:", b"line 8:"))
    assert load_corpus(path).info.checksum != corpus.info.checksum


def test_large_text_file_is_split_by_whole_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    text = bytes(rng.integers(32, 127, size=40 * data.CHUNK_BYTES + 123, dtype=np.uint8))
    path = tmp_path / "big.txt"
    path.write_bytes(text)
    corpus = load_corpus(path, val_fraction=0.2)
    chunks = [text[i : i + data.CHUNK_BYTES] for i in range(0, len(text), data.CHUNK_BYTES)]
    flags = assign_documents([str(i) for i in range(len(chunks))], 0.2)
    val = b"".join(c for c, v in zip(chunks, flags, strict=True) if v)
    assert 0 < len(val) < len(text)
    assert corpus.val.astype(np.uint8).tobytes() == val
    assert corpus.info.n_tokens == len(text)
    capped = load_corpus(path, max_bytes=3 * data.CHUNK_BYTES)
    assert capped.info.n_tokens == 3 * data.CHUNK_BYTES


def test_folder_files_are_documents(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / ".git").mkdir()
    (folder / ".git" / "index").write_bytes(b"\xff\xfe binary")  # hidden: skipped
    contents = {f"f{i}.txt": f"file {i}\n" * 50 for i in range(6)}
    contents["sub/nested.py"] = "x = 1"  # no trailing newline: one is added
    for name, text in contents.items():
        (folder / name).write_text(text)
    (folder / "empty.txt").write_text("")
    corpus = load_corpus(folder, val_fraction=0.3)
    assert corpus.info.name == "corpus"
    assert corpus.info.n_tokens == sum(len(t) for t in contents.values()) + 1
    ids = sorted(contents)
    flags = assign_documents(ids, 0.3)
    docs = [contents[i] if contents[i].endswith("\n") else contents[i] + "\n" for i in ids]
    val = "".join(d for d, v in zip(docs, flags, strict=True) if v)
    assert 0 < len(val) < corpus.info.n_tokens
    assert corpus.val.astype(np.uint8).tobytes() == val.encode()
    before = corpus.info.checksum
    (folder / "f0.txt").write_text("file zero\n" * 50)
    assert load_corpus(folder, val_fraction=0.3).info.checksum != before


@pytest.mark.parametrize(
    ("suffix", "token_dtype", "dtype"),
    [(".bin", None, np.uint16), (".u16", None, np.uint16), (".u32", None, np.uint32),
     (".dat", "uint16", np.uint16), (".tok", "uint32", np.uint32)],
)  # fmt: skip
def test_token_files(tmp_path: Path, suffix: str, token_dtype: str | None, dtype: type) -> None:
    tokens = np.random.default_rng(1).integers(0, 70_000 if dtype == np.uint32 else 5_000, 1_000)
    path = token_file(tmp_path / f"tokens{suffix}", tokens.astype(dtype))
    corpus = load_corpus(path, token_dtype=token_dtype)
    assert corpus.info.n_tokens == 1_000
    assert (corpus.info.n_train_tokens, corpus.info.n_val_tokens) == (900, 100)
    assert np.array_equal(np.concatenate([corpus.train, corpus.val]), tokens)
    assert corpus.train.dtype == dtype
    assert corpus.vocab_size == int(tokens.max()) + 1
    assert load_corpus(path, token_dtype=token_dtype, vocab_size=100_000).vocab_size == 100_000
    assert load_corpus(path, token_dtype=token_dtype, max_bytes=800).info.n_tokens == 800 // (
        np.dtype(dtype).itemsize
    )
    assert corpus.info.checksum == checksum(corpus)
    assert load_corpus(path, token_dtype=token_dtype, val_fraction=0.2).info.checksum != (
        corpus.info.checksum
    )
    tokens[500] += 1
    token_file(path, tokens.astype(dtype))
    assert load_corpus(path, token_dtype=token_dtype).info.checksum != corpus.info.checksum


# --- errors --------------------------------------------------------------------------------


def test_path_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    expect_error("corpus", str(missing), "does not exist", source=missing)
    expect_error("corpus", "does not exist", source=tmp_path / "nope.bin")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    expect_error("corpus", str(empty), "no tokens", source=empty)
    expect_error("corpus", "no tokens", source=empty, token_dtype="uint16")
    (tmp_path / "hollow" / "sub").mkdir(parents=True)
    expect_error("corpus", "hollow", "no tokens", source=tmp_path / "hollow")
    (tmp_path / "hollow" / "sub" / "blank.md").write_text("")
    expect_error("corpus", "hollow", "no tokens", source=tmp_path / "hollow")
    expect_error("corpus", "hollow", "folder", source=tmp_path / "hollow", token_dtype="uint32")
    one = tmp_path / "one.txt"
    one.write_text("x")
    expect_error("corpus", str(one), "too few tokens", source=one)


def test_non_utf8_text_is_reported_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café\n".encode("latin-1") * 10)
    expect_error("corpus", str(bad), "not valid UTF-8", source=bad)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.txt").write_text("fine\n" * 10)
    (folder / "bad.txt").write_bytes(b"ok\n\xc3\x28\n")
    expect_error("corpus", str(folder / "bad.txt"), "not valid UTF-8", source=folder)


@pytest.mark.timeout(60)  # opening a FIFO for reading would block forever
def test_unreadable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)  # opening it would block: it must be refused before any read
    expect_error("corpus", str(fifo), "not a regular file", source=fifo)
    expect_error("corpus", str(fifo), "not a regular file", source=fifo, token_dtype="uint16")
    link = tmp_path / "dangling.txt"
    link.symlink_to(tmp_path / "gone.txt")
    expect_error("corpus", str(link), "broken symbolic link", source=link)
    folder = tmp_path / "with_link"
    folder.mkdir()
    (folder / "a.txt").write_text("text\n" * 10)
    (folder / "b.txt").symlink_to(tmp_path / "gone.txt")
    expect_error("corpus", str(folder / "b.txt"), "broken symbolic link", source=folder)

    secret = tmp_path / "secret.txt"
    secret.write_text("hidden\n" * 10)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(args[0]))

    # the OS refusing the read, where a corpus file is opened
    monkeypatch.setattr(corpus_files, "open", denied, raising=False)
    expect_error("corpus", str(secret), "cannot read", "Permission denied", source=secret)


def test_token_file_size_must_be_a_multiple_of_the_dtype(tmp_path: Path) -> None:
    odd = tmp_path / "odd.u32"
    odd.write_bytes(b"\x01\x00\x00\x00\x02\x00")
    expect_error("corpus", str(odd), "6 bytes", "multiple of 4", source=odd)
    odd.write_bytes(b"\x01\x00\x02")
    expect_error("corpus", str(odd), "3 bytes", "multiple of 2", source=odd, token_dtype="uint16")


@pytest.mark.parametrize("fraction", [0.0, -0.1, 0.51, 1.0, float("nan")])
def test_val_fraction_must_be_in_range(fraction: float) -> None:
    expect_error("val_fraction", "(0, 0.5]", source=None, val_fraction=fraction)


def test_token_dtype_and_vocab_size_are_checked(tmp_path: Path) -> None:
    path = token_file(tmp_path / "t.u16", np.arange(300, dtype=np.uint16))
    expect_error("token_dtype", "int8", "uint16", source=path, token_dtype="int8")
    expect_error("token_dtype", "built-in", source="builtin", token_dtype="uint16")
    expect_error("vocab_size", "256", "300", str(path), source=path, vocab_size=256)


def test_too_small_for_a_batch(counting: Corpus, tmp_path: Path) -> None:
    counting.check_fits(4, 999)  # the validation split holds 1,000 tokens
    for call in (
        lambda: counting.check_fits(4, 1_000),
        lambda: counting.batch("val", 1, 1_000, torch.Generator()),
        lambda: counting.eval_batches(1, 1_000, 1),
    ):
        with pytest.raises(CorpusError) as info:
            call()
        assert info.value.field == "seq_len"
        assert "count.u32" in str(info.value) and "1000 tokens" in str(info.value)
    with pytest.raises(CorpusError) as info:
        counting.check_fits(0, 16)
    assert info.value.field == "batch_size"
    with pytest.raises(CorpusError) as info:
        counting.check_fits(4, 0)
    assert info.value.field == "seq_len"
    with pytest.raises(CorpusError) as info:
        counting.batch("test", 4, 16, torch.Generator())
    assert info.value.field == "split"


@pytest.mark.parametrize(
    ("cls", "field", "reason"),
    [
        (CorpusError, "corpus", "/data/x.txt does not exist"),
        (TrainSpecError, "budget_tokens", "fewer than one optimizer step"),
    ],
    ids=["CorpusError", "TrainSpecError"],
)
def test_field_errors_survive_pickling(cls: type[ValueError], field: str, reason: str) -> None:
    """They cross Ray (and multiprocessing) pickled: the field and reason arrive intact,
    not as an "UnserializableException" (their __init__ takes (field, reason))."""
    err = cls(field, reason)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.field, back.reason, str(back)) == (field, reason, f"{field}: {reason}")  # type: ignore[attr-defined]


def test_a_folder_corpus_never_reads_outside_itself(tmp_path: Path) -> None:
    """The folder is what the operator allowed: a link inside it that leads out is refused,
    one that stays inside is read."""
    outside = tmp_path / "secret.txt"
    outside.write_text("password=hunter2\n" * 50)
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world\n" * 200)
    (folder / "b.txt").write_text("another document\n" * 200)
    (folder / "same.txt").symlink_to(folder / "a.txt")
    corpus = load_corpus(str(folder))
    assert corpus.info.n_tokens > 0
    (folder / "leak.txt").symlink_to(outside)
    with pytest.raises(CorpusError) as err:
        load_corpus(str(folder))
    assert err.value.field == "corpus" and "leak.txt" in err.value.reason
    assert "outside" in err.value.reason
