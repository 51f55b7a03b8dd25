"""Corpora of records: JSON Lines, Parquet and a dataset saved by `datasets.save_to_disk`.

Each record's text field (`text` unless the spec names another) is one document of the
document-level split, its id `<file>:<record index>`. Files are read from a descriptor already
opened (beneath the data folder, no link followed: `workers.data`); Parquet and Arrow need
`pyarrow` (the `corpora` extra), JSON Lines only the standard library.

Every problem is a `CorpusError` naming the path and, where one is at fault, the record:
malformed JSON, a record that is not an object, a missing or non-string field, bytes that are
not UTF-8, a file that is not Parquet or Arrow, and a file over `MAX_RECORD_FILE_BYTES`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from workers.data_errors import CorpusError, Document

#: The file suffixes read as records.
RECORD_SUFFIXES = (".jsonl", ".parquet", ".arrow")
#: A record file larger than this is refused before anything is read (a corpus's text is
#: held in memory; 4 GiB is far above what a search trains on).
MAX_RECORD_FILE_BYTES = 4 * 2**30
#: The files a `save_to_disk` dataset's folder holds beside its Arrow files.
DATASET_STATE = "state.json"
DEFAULT_TEXT_FIELD = "text"


def is_record_file(name: str) -> bool:
    """Whether the file `name` is read as records (by its suffix)."""
    return name.lower().endswith(RECORD_SUFFIXES)


def record_documents(
    f: BinaryIO, shown: str, doc_prefix: str, text_field: str, max_bytes: int | None
) -> list[Document]:
    """The documents of the record file open as `f` (closed by the caller), `shown` in
    messages, ids `<doc_prefix>:<index>`. With `max_bytes`, records are read in order until
    their text holds that many bytes (the last whole record kept)."""
    size = os.fstat(f.fileno()).st_size
    if size > MAX_RECORD_FILE_BYTES:
        raise CorpusError(
            "corpus",
            f"{shown} holds {size} bytes, over the limit of {MAX_RECORD_FILE_BYTES} for a "
            "record file; split it into smaller files in a folder",
        )
    lower = shown.lower().rstrip("'\"")
    if lower.endswith(".jsonl"):
        texts = _jsonl_texts(f, shown, text_field)
    elif lower.endswith(".parquet"):
        texts = _parquet_texts(f, shown, text_field)
    else:
        texts = _arrow_texts(f, shown, text_field)
    docs, total = [], 0
    for index, text in texts:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped in JSON ("\\ud800")
            raise CorpusError(
                "corpus", f"{shown} record {index}: field {text_field!r} is not valid Unicode"
            ) from None
        if not data:
            continue
        data = data if data.endswith(b"\n") else data + b"\n"
        docs.append(Document(f"{doc_prefix}:{index}", data))
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return docs


def _jsonl_texts(f: BinaryIO, shown: str, text_field: str) -> Iterator[tuple[int, str]]:
    """(record index, text) of every non-blank line of a JSON Lines file."""
    index = 0
    for number, raw in enumerate(f, start=1):
        where = f"{shown} line {number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(
                "corpus", f"{where} is not valid UTF-8 text (byte {e.start} of the line)"
            ) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise CorpusError("corpus", f"{where} is not a JSON record: {reason}") from None
        if not isinstance(record, dict):
            raise CorpusError("corpus", f"{where} is a JSON {type(record).__name__}, not an object")
        yield index, _text_of(record, text_field, where)
        index += 1


def _text_of(record: dict[str, Any], text_field: str, where: str) -> str:
    if text_field not in record:
        fields = ", ".join(repr(k) for k in list(record)[:10]) or "none"
        raise CorpusError("corpus", f"{where} has no field {text_field!r} (its fields: {fields})")
    text = record[text_field]
    if not isinstance(text, str):
        raise CorpusError(
            "corpus",
            f"{where}: field {text_field!r} is {_kind(text)}, not a string",
        )
    return text


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _pyarrow(shown: str) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise CorpusError(
            "corpus",
            f"{shown} needs pyarrow to be read (install depthscope[corpora])",
        ) from None
    return pyarrow


def _column_texts(
    batches: Iterator[Any], shown: str, text_field: str, names: list[str], kind: str
) -> Iterator[tuple[int, str]]:
    """(record index, text) of the column `text_field` of Arrow record batches."""
    pa = _pyarrow(shown)
    if text_field not in names:
        listed = ", ".join(repr(n) for n in names[:10]) or "none"
        raise CorpusError("corpus", f"{shown} has no column {text_field!r} (its columns: {listed})")
    index = 0
    for batch in batches:
        column = batch.column(batch.schema.get_field_index(text_field))
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise CorpusError(
                "corpus", f"{shown}: column {text_field!r} holds {column.type}, not strings"
            )
        for value in column.to_pylist():
            if value is None:
                raise CorpusError("corpus", f"{shown} {kind} {index}: field {text_field!r} is null")
            yield index, value
            index += 1


def _guarded(read: Callable[[], Iterator[tuple[int, str]]], shown: str, what: str) -> Any:
    """The records `read` yields, with pyarrow's errors on a damaged file as `CorpusError`."""
    pa = _pyarrow(shown)
    try:
        yield from read()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError("corpus", f"{shown} is not a readable {what} file: {e}") from None


def _parquet_texts(f: BinaryIO, shown: str, text_field: str) -> Iterator[tuple[int, str]]:
    def read() -> Iterator[tuple[int, str]]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        names = list(pf.schema_arrow.names)
        columns = [text_field] if text_field in names else None
        batches = pf.iter_batches(batch_size=1024, columns=columns)
        yield from _column_texts(batches, shown, text_field, names, "record")

    return _guarded(read, shown, "Parquet")  # type: ignore[no-any-return]


def _arrow_texts(f: BinaryIO, shown: str, text_field: str) -> Iterator[tuple[int, str]]:
    """An Arrow file of a `save_to_disk` dataset (the IPC stream format; the file format
    is read too)."""

    def read() -> Iterator[tuple[int, str]]:
        pa = _pyarrow(shown)
        head = f.read(6)
        f.seek(0)
        reader = pa.ipc.open_file(f) if head == b"ARROW1" else pa.ipc.open_stream(f)
        names = list(reader.schema.names)
        if head == b"ARROW1":
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        yield from _column_texts(batches, shown, text_field, names, "record")

    return _guarded(read, shown, "Arrow")  # type: ignore[no-any-return]


def dataset_files(state: bytes, shown: str) -> list[str]:
    """The Arrow files a `save_to_disk` dataset's `state.json` lists, in order (plain names
    inside its folder)."""
    try:
        files = json.loads(state)["_data_files"]
        names = [str(entry["filename"]) for entry in files]
    except (ValueError, KeyError, TypeError):
        raise CorpusError(
            "corpus", f"{shown} is not the state.json of a dataset saved by save_to_disk"
        ) from None
    for name in names:
        if "/" in name or name.startswith(".") or not name.endswith(".arrow"):
            raise CorpusError("corpus", f"{shown} lists {name!r}, not an Arrow file beside it")
    if not names:
        raise CorpusError("corpus", f"{shown} lists no data files")
    return names
