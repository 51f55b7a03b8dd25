"""Corpora of records: JSON Lines, Parquet and a `save_to_disk` dataset, each record one
document of the split, read beneath the data folder like any corpus; every malformed input is
a `CorpusError` naming the path and the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workers.data import CorpusError, assign_documents, load_corpus
from workers.data_records import MAX_RECORD_FILE_BYTES

TEXTS = [f"document {i}: " + "lorem ipsum dolor sit amet " * (i % 5 + 1) for i in range(60)]


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> None:
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))


def expected_split(ids: list[str], texts: list[str]) -> tuple[bytes, bytes]:
    flags = assign_documents(ids, 0.1)
    train = b"".join((t + "\n").encode() for t, v in zip(texts, flags, strict=True) if not v)
    val = b"".join((t + "\n").encode() for t, v in zip(texts, flags, strict=True) if v)
    return train, val


@pytest.mark.parametrize("beneath", [False, True])
def test_jsonl_records_are_documents(tmp_path: Path, beneath: bool) -> None:
    write_jsonl(tmp_path / "c.jsonl", TEXTS)
    corpus = (
        load_corpus("c.jsonl", root=str(tmp_path)) if beneath else load_corpus(tmp_path / "c.jsonl")
    )
    train, val = expected_split([f"c.jsonl:{i}" for i in range(len(TEXTS))], TEXTS)
    assert corpus.train.tobytes() == np.frombuffer(train, np.uint8).astype(np.uint16).tobytes()
    assert corpus.val.tobytes() == np.frombuffer(val, np.uint8).astype(np.uint16).tobytes()
    assert corpus.info.n_val_tokens == len(val) and len(val) > 0
    assert corpus.info.vocab_size == 256


def test_the_text_field_the_spec_names(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "c.jsonl", TEXTS, field="content")
    corpus = load_corpus(tmp_path / "c.jsonl", text_field="content")
    assert corpus.info.n_tokens == sum(len(t) + 1 for t in TEXTS)
    with pytest.raises(CorpusError, match=r"c.jsonl line 1 has no field 'text'.*'content'"):
        load_corpus(tmp_path / "c.jsonl")


def test_parquet_records_are_documents(tmp_path: Path) -> None:
    table = pa.table({"text": TEXTS, "n": list(range(len(TEXTS)))})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=7)
    b = load_corpus(tmp_path / "c.parquet")
    train, val = expected_split([f"c.parquet:{i}" for i in range(len(TEXTS))], TEXTS)
    assert b.train.tobytes() == np.frombuffer(train, np.uint8).astype(np.uint16).tobytes()
    c = load_corpus("c.parquet", root=str(tmp_path))
    assert np.array_equal(b.val, c.val) and len(val) == len(c.val)


def test_a_folder_of_record_files(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    write_jsonl(tmp_path / "shards" / "a.jsonl", TEXTS[:30])
    pq.write_table(pa.table({"text": TEXTS[30:]}), tmp_path / "shards" / "b.parquet")
    corpus = load_corpus("shards", root=str(tmp_path))
    ids = [f"a.jsonl:{i}" for i in range(30)] + [f"b.parquet:{i}" for i in range(30)]
    train, _ = expected_split(ids, TEXTS)
    assert corpus.train.tobytes() == np.frombuffer(train, np.uint8).astype(np.uint16).tobytes()


def save_to_disk_layout(folder: Path, texts: list[str]) -> None:
    """What `datasets.Dataset.save_to_disk` writes: Arrow stream files and state.json."""
    folder.mkdir()
    halves = [texts[: len(texts) // 2], texts[len(texts) // 2 :]]
    names = [f"data-0000{i}-of-00002.arrow" for i in range(2)]
    for name, part in zip(names, halves, strict=True):
        table = pa.table({"text": part})
        with pa.ipc.new_stream(str(folder / name), table.schema) as writer:
            writer.write_table(table)
    state = {"_data_files": [{"filename": n} for n in names], "_split": "train"}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))


def test_a_dataset_saved_to_disk(tmp_path: Path) -> None:
    save_to_disk_layout(tmp_path / "ds", TEXTS)
    corpus = load_corpus("ds", root=str(tmp_path))
    assert corpus.info.n_tokens == sum(len(t) + 1 for t in TEXTS)
    assert load_corpus(tmp_path / "ds").info.checksum == corpus.info.checksum


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "a"}\n{"text": "b"\n', r"'c.jsonl' line 2 is not a JSON record"),
        (b'{"text": "a"}\n[1, 2]\n', r"'c.jsonl' line 2 is a JSON list, not an object"),
        (b'{"text": "a"}\n{"body": "b"}\n', r"'c.jsonl' line 2 has no field 'text'"),
        (b'{"text": 3}\n', r"'c.jsonl' line 1: field 'text' is a int, not a string"),
        (b'{"text": null}\n', r"line 1: field 'text' is null"),
        (b"\x00\xff\xfe\x89PNG junk\n", r"'c.jsonl' line 1 is not valid UTF-8"),
        (b'{"text": "\\ud800"}\n', r"record 0: field 'text' is not valid Unicode"),
        (b"[" * 100_000 + b"\n", r"line 1 is not a JSON record"),
    ],
)
def test_malformed_jsonl_names_the_path_and_record(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "c.jsonl").write_bytes(content)
    with pytest.raises(CorpusError, match=message) as info:
        load_corpus("c.jsonl", root=str(tmp_path))
    assert info.value.field == "corpus"


def test_malformed_parquet_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "junk.parquet").write_bytes(os.urandom(5000))
    with pytest.raises(CorpusError, match=r"'junk.parquet' is not a readable Parquet file"):
        load_corpus("junk.parquet", root=str(tmp_path))
    pq.write_table(pa.table({"body": ["x"] * 10}), tmp_path / "nofield.parquet")
    with pytest.raises(CorpusError, match=r"no column 'text' \(its columns: 'body'\)"):
        load_corpus("nofield.parquet", root=str(tmp_path))
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "ints.parquet")
    with pytest.raises(CorpusError, match=r"column 'text' holds int64, not strings"):
        load_corpus("ints.parquet", root=str(tmp_path))
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "null.parquet")
    with pytest.raises(CorpusError, match=r"'null.parquet' record 1: field 'text' is null"):
        load_corpus("null.parquet", root=str(tmp_path))


def test_a_ten_gigabyte_record_file_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:  # sparse: no disk is used
        f.truncate(10 * 10**9)
    assert MAX_RECORD_FILE_BYTES < 10 * 10**9
    with pytest.raises(CorpusError, match=r"'big.jsonl' holds 10000000000 bytes, over the limit"):
        load_corpus("big.jsonl", root=str(tmp_path))


def test_a_link_to_a_record_file_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    write_jsonl(outside, TEXTS)
    data = tmp_path / "data"
    data.mkdir()
    (data / "c.jsonl").symlink_to(outside)
    with pytest.raises(CorpusError, match="symbolic link"):
        load_corpus("c.jsonl", root=str(data))


def test_a_damaged_dataset_state_names_it(tmp_path: Path) -> None:
    save_to_disk_layout(tmp_path / "ds", TEXTS)
    (tmp_path / "ds" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../x"}]}))
    with pytest.raises(CorpusError, match=r"state.json' lists '../x'"):
        load_corpus("ds", root=str(tmp_path))
    (tmp_path / "ds" / "state.json").write_text("not json")
    with pytest.raises(CorpusError, match=r"not the state.json of a dataset"):
        load_corpus("ds", root=str(tmp_path))


def test_text_jsonl_and_byte_tokens_need_neither_pyarrow_nor_tokenizers(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "c.jsonl", TEXTS)
    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "c.parquet")
    code = f"""
import sys
sys.modules["pyarrow"] = None  # an import of either now fails, as when not installed
sys.modules["tokenizers"] = None
from workers.data import CorpusError, load_corpus
assert load_corpus(max_bytes=100_000).info.tokenizer == "byte"
assert load_corpus({str(tmp_path / "c.jsonl")!r}).info.n_tokens > 0
for kw in ({{}}, {{"tokenizer": "bpe", "tokenizer_vocab": 512}}):
    source = {str(tmp_path / "c.parquet")!r} if not kw else {str(tmp_path / "c.jsonl")!r}
    try:
        load_corpus(source, **kw)
    except CorpusError as e:
        print(e)
"""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "needs pyarrow to be read (install depthscope[corpora])" in out
    assert "kind bpe needs the tokenizers package (install depthscope[corpora])" in out
