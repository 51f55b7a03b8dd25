"""The documents of a corpus's sources: the built-in corpus (the standard library's
sources), a text or record file, a folder, a dataset saved by `save_to_disk`, and a file
beneath the operator's data folder; each a list of `Document`s, kept under a byte limit in
a stable shuffled order (`select`)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from workers.corpus_files import (
    check_regular,
    file_of,
    open_at,
    open_file_at,
    open_regular,
    text_of,
    walk_fd,
)
from workers.data_errors import CorpusError, Document
from workers.data_records import (
    DATASET_STATE,
    DEFAULT_TEXT_FIELD,
    dataset_files,
    is_record_file,
    record_documents,
)

log = logging.getLogger(__name__)

DEFAULT_BUILTIN_BYTES = 8 * 2**20  # ≈ 2/3 of the stdlib's 12 MB of non-test sources
CHUNK_BYTES = 64 * 2**10  # document size when a single text file is the whole corpus
_STDLIB_EXCLUDED = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)


def select(sizes: Sequence[int], ids: Sequence[str], max_bytes: int | None) -> list[int]:
    """Indices of the documents kept under `max_bytes`: greedily in a salted-hash order (a
    stable shuffle, not the alphabetical prefix), returned in their original order."""
    if max_bytes is None or sum(sizes) <= max_bytes:
        return list(range(len(sizes)))
    order = sorted(
        range(len(ids)), key=lambda i: hashlib.sha256(b"select:" + ids[i].encode()).digest()
    )
    kept, total = [], 0
    for i in order:
        if total + sizes[i] <= max_bytes:
            kept.append(i)
            total += sizes[i]
    return sorted(kept)


def stdlib_documents(max_bytes: int | None = DEFAULT_BUILTIN_BYTES) -> list[Document]:
    """The built-in corpus's documents: the standard library's `.py` sources (no tests, no
    site-packages), in sorted relative-path order, each `# ==== <path> ====\\n` + source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_EXCLUDED)
        rel = Path(folder).relative_to(root)
        paths += [(rel / f).as_posix() for f in files if f.endswith(".py")]
    paths.sort()
    header = {p: f"# ==== {p} ====\n".encode() for p in paths}
    sizes = [len(header[p]) + (root / p).stat().st_size for p in paths]
    docs = []
    for i in select(sizes, paths, max_bytes):
        data = (root / paths[i]).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            log.debug("skipping %s: not UTF-8", paths[i])
            continue
        docs.append(Document(paths[i], header[paths[i]] + data))
    return docs


def beneath_documents(
    dir_fd: int, shown: str, max_bytes: int | None, text_field: str = DEFAULT_TEXT_FIELD
) -> list[Document]:
    """`_folder_documents` for the folder open as `dir_fd`, never following a link."""
    dataset = dataset_documents(dir_fd, shown, max_bytes, text_field)
    if dataset is not None:
        return dataset
    found: list[tuple[str, int]] = []
    walk_fd(dir_fd, shown, found)
    ids = [p[len(shown) + 1 :] for p, _ in found]
    docs = []
    for i in select([size + 1 for _, size in found], ids, max_bytes):
        fd = open_file_at(dir_fd, ids[i], found[i][0])
        docs += file_documents(fd, repr(found[i][0]), ids[i], text_field, None)
    return docs


def file_documents(
    fd: int, shown: str, doc_id: str, text_field: str, max_bytes: int | None
) -> list[Document]:
    """The documents of one file of a folder open as `fd` (closed here): its records when
    it is a record file (`workers.data_records`), else its text, ending with a newline."""
    if is_record_file(doc_id):
        with file_of(fd, shown) as f:
            return record_documents(f, shown, doc_id, text_field, max_bytes)
    data = text_of(fd, shown, max_bytes)
    return [Document(doc_id, data if data.endswith(b"\n") else data + b"\n")] if data else []


def dataset_documents(
    dir_fd: int, shown: str, max_bytes: int | None, text_field: str
) -> list[Document] | None:
    """The records of a dataset saved by `datasets.save_to_disk` in the folder `dir_fd`
    (its `state.json` lists its Arrow files); None when the folder is not one."""
    try:
        fd, st = open_at(dir_fd, DATASET_STATE, f"{shown}/{DATASET_STATE}")
    except CorpusError:
        return None
    state_shown = repr(f"{shown}/{DATASET_STATE}")
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorpusError("corpus", f"{state_shown} is not a regular file")
    names = dataset_files(text_of(fd, state_shown, 2**20), state_shown)
    docs: list[Document] = []
    for name in names:
        left = None if max_bytes is None else max_bytes - sum(len(d.data) for d in docs)
        if left is not None and left <= 0:
            break
        file_shown = f"{shown}/{name}"
        fd = open_file_at(dir_fd, name, file_shown)
        with file_of(fd, repr(file_shown)) as f:
            docs += record_documents(f, repr(file_shown), name, text_field, left)
    return docs


def folder_documents(
    folder: Path, max_bytes: int | None, text_field: str = DEFAULT_TEXT_FIELD
) -> list[Document]:
    """Every file under `folder` (recursively, sorted, hidden entries skipped), one document
    each, ending with a newline; a record file's records (`workers.data_records`) each one
    document; a dataset saved by `save_to_disk` its records."""
    if (folder / DATASET_STATE).exists():
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            docs = dataset_documents(fd, folder.name, max_bytes, text_field)
        finally:
            os.close(fd)
        assert docs is not None
        return docs
    paths = []
    for sub, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        rel = Path(sub).relative_to(folder)
        paths += [(rel / f).as_posix() for f in files if not f.startswith(".")]
    paths.sort()
    root = folder.resolve()
    for p in paths:
        check_regular(folder / p)
        if not (folder / p).resolve().is_relative_to(root):  # the folder is what was allowed
            raise CorpusError("corpus", f"{p} in {folder.name} leads outside the folder")
    sizes = [(folder / p).stat().st_size + 1 for p in paths]
    docs = []
    for i in select(sizes, paths, max_bytes):
        fd = open_regular(folder / paths[i], str(folder / paths[i]))
        docs += file_documents(fd, str(folder / paths[i]), paths[i], text_field, None)
    return docs


def chunks(data: bytes) -> list[Document]:
    """A single text file's documents: its `CHUNK_BYTES` chunks."""
    return [
        Document(str(i), data[start : start + CHUNK_BYTES])
        for i, start in enumerate(range(0, len(data), CHUNK_BYTES))
    ]
