"""Reading a corpus's files safely: a path the user chose opened once and checked after
opening (a regular file, never a FIFO or device), files beneath the operator's data folder
opened component by component with no symbolic link followed, and text read as UTF-8 with a
clear error naming the file."""

from __future__ import annotations

import codecs
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from workers.data_errors import CorpusError


def read_text(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular UTF-8 text file (the first `max_bytes` if given)."""
    check_regular(path)
    return text_of(open_regular(path, str(path)), str(path), max_bytes)


def text_of(fd: int, shown: str, max_bytes: int | None = None) -> bytes:
    """The UTF-8 text read from the open descriptor `fd` (closed here), named `shown`."""
    try:
        with file_of(fd, shown) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes)
            truncated = max_bytes is not None and f.read(1) != b""
    except OSError as e:
        raise CorpusError("corpus", f"cannot read {shown}: {e.strerror or e}") from e
    try:  # a cut in the middle of a character is not an error when truncated
        codecs.getincrementaldecoder("utf-8")().decode(data, final=not truncated)
    except UnicodeDecodeError as e:
        raise CorpusError(
            "corpus",
            f"{shown} is not valid UTF-8 text (byte {e.start}); "
            "pass token_dtype='uint16' or 'uint32' if it holds tokens",
        ) from e
    return data


def file_of(fd: int, shown: str) -> BinaryIO:
    """A file object owning the descriptor `fd` (closed if one cannot be made)."""
    try:
        return open(fd, "rb")
    except OSError as e:
        os.close(fd)
        raise CorpusError("corpus", f"cannot read {shown}: {e.strerror or e}") from e


def check_regular(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise CorpusError("corpus", f"{path} is a broken symbolic link")
    if not path.exists():
        raise CorpusError("corpus", f"{path} does not exist")
    if not path.is_file():
        raise CorpusError("corpus", f"{path} is not a regular file")


# -- opening: once, then the descriptor is checked and read ------------------------------------
# O_NONBLOCK: opening a FIFO for reading would block until a writer came; with it the open
# returns at once and the descriptor's type refuses it. It does not change regular files.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | os.O_CLOEXEC
_NO_LINK = _OPEN_FLAGS | os.O_NOFOLLOW


def open_regular(path: Path, shown: str) -> int:
    """A descriptor of the regular file at `path` (a path the user chose: links followed),
    checked after opening, so what is read is what was checked."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise CorpusError("corpus", f"{shown} does not exist") from None
    except OSError as e:
        raise CorpusError("corpus", f"cannot read {shown}: {e.strerror or e}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorpusError("corpus", f"{shown} is not a regular file")
    return fd


def rel_parts(source: str) -> list[str]:
    """The components of a path relative to the data folder, refused by its text alone when
    it names nothing below the folder (empty, "."), is absolute or climbs with `..`."""
    parts = [p for p in source.split("/") if p not in ("", ".")]
    if not parts or source.startswith("/") or ".." in parts:
        raise CorpusError("corpus", f"{source!r} is not a relative path inside the data folder")
    return parts


def open_at(dir_fd: int, name: str, shown: str) -> tuple[int, os.stat_result]:
    """Open `name` in the folder `dir_fd` without following a link; its descriptor and
    type. `shown` (relative to the data folder) names it in every refusal."""
    try:
        fd = os.open(name, _NO_LINK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: the BSDs' answer
            reason = "is a symbolic link; links are not followed inside the data folder"
        elif e.errno == errno.ENOENT:
            reason = "does not exist in the data folder"
        else:
            reason = f"cannot be read: {e.strerror or e}"
        raise CorpusError("corpus", f"{shown!r} {reason}") from None
    return fd, os.fstat(fd)


def open_beneath(root: str, parts: Sequence[str]) -> tuple[int, os.stat_result]:
    """Open the path `parts` beneath the folder `root` one component at a time, never
    following a link: its descriptor and type (a folder or a regular file)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise CorpusError("corpus", f"the data folder cannot be read: {e.strerror or e}") from e
    st = os.fstat(fd)
    for i, name in enumerate(parts):
        shown = "/".join(parts[: i + 1])
        try:
            if not stat.S_ISDIR(st.st_mode):
                raise CorpusError("corpus", f"{'/'.join(parts[:i])!r} is not a folder")
            child, st = open_at(fd, name, shown)
        finally:
            os.close(fd)
        fd = child
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        os.close(fd)
        raise CorpusError("corpus", f"{'/'.join(parts)!r} is not a regular file or a folder")
    return fd, st


def walk_fd(dir_fd: int, prefix: str, out: list[tuple[str, int]]) -> None:
    """Append (relative path, size) for every regular file under the folder `dir_fd`
    (hidden entries and `__pycache__` skipped); a link or any other kind is refused."""
    with os.scandir(dir_fd) as entries:
        names = sorted((e.name, e.stat(follow_symlinks=False)) for e in entries)
    for name, st in names:
        if name.startswith(".") or name == "__pycache__":
            continue
        shown = f"{prefix}/{name}"
        if stat.S_ISDIR(st.st_mode):
            child, cst = open_at(dir_fd, name, shown)
            try:
                if not stat.S_ISDIR(cst.st_mode):
                    raise CorpusError("corpus", f"{shown!r} changed while it was read")
                walk_fd(child, shown, out)
            finally:
                os.close(child)
        elif stat.S_ISLNK(st.st_mode):
            raise CorpusError(
                "corpus",
                f"{shown!r} is a symbolic link; links are not followed inside the data folder",
            )
        elif not stat.S_ISREG(st.st_mode):
            raise CorpusError("corpus", f"{shown!r} is not a regular file")
        else:
            out.append((shown, st.st_size))


def open_file_at(dir_fd: int, rel: str, shown: str) -> int:
    """A descriptor of the regular file `rel` (components joined by "/") under `dir_fd`."""
    fd = os.dup(dir_fd)
    parts = rel.split("/")
    for i, name in enumerate(parts):
        try:
            child, st = open_at(fd, name, shown)
        finally:
            os.close(fd)
        fd = child
        want_dir = i < len(parts) - 1
        if stat.S_ISDIR(st.st_mode) != want_dir or not (want_dir or stat.S_ISREG(st.st_mode)):
            os.close(fd)
            raise CorpusError("corpus", f"{shown!r} is not a regular file")
    return fd
