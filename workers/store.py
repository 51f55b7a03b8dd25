"""The artifact store: bytes under "/"-joined keys in a local folder or any fsspec URL
(`file://`, `memory://`, `s3://`…), without torch.

A segment of a multi-fidelity run saves its main line's state here (`workers.checkpoint`) and
the next segment, perhaps on another node, resumes from it: the store is the only thing the
segments share, so it must be reachable from every worker (a shared folder or an object store
for a cluster). Keys are built by the runner; they are checked here anyway, so that no key can
reach outside the store's root. Writes are atomic (a temporary name, then a move): a reader
never sees half a checkpoint, whatever happens to the writer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import secrets
import stat
from typing import Any

from fsspec.core import url_to_fs  # type: ignore[import-untyped]  # no stubs
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from cost_model import CostInputError
from workers.contract import TrainSpecError

#: One segment of a key: letters, digits, dot, underscore, hyphen ("." and ".." refused).
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
#: What `put` appends to a key while it writes (never listed by `keys`).
_TMP = ".tmp-"
_TMP_NAME = re.compile(re.escape(_TMP) + r"[0-9a-f]{16}$")


class StoreError(CostInputError):
    """An unusable artifact store or key (`field`: "artifact_store" or "key", `reason`)."""

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (it crosses Ray)
        return (type(self), (self.field, self.reason))


class CheckpointError(TrainSpecError):
    """A checkpoint that cannot be used: missing, unreadable, corrupt, too large, or not the
    state this run asked for (another run's, another step's). `field` is "checkpoint"."""

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (it crosses Ray)
        return (type(self), (self.field, self.reason))


def check_key(key: str) -> str:
    """`key` itself if it is "/"-joined segments of `[A-Za-z0-9._-]`, none empty, "." or "..";
    else `StoreError("key", ...)`."""
    if not isinstance(key, str) or not key:
        raise StoreError("key", f"must be a non-empty string, got {key!r}")
    for segment in key.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT.fullmatch(segment):
            raise StoreError(
                "key",
                f"{key!r}: every '/'-separated part must be letters, digits, '.', '_' or '-' "
                "(and not empty, '.' or '..')",
            )
    return key


class ArtifactStore:
    """Bytes under keys below the root `url` (a folder path, or an fsspec URL).

    Building one touches nothing (`check` does); every method checks its key first."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self._fs, root = url_to_fs(url)
        except (ValueError, ImportError) as exc:  # unknown protocol, or its package missing
            raise StoreError("artifact_store", f"cannot open {url!r}: {exc}") from exc
        self._root = root.rstrip("/")

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    def _path(self, key: str) -> str:
        return f"{self._root}/{check_key(key)}"

    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing what was there: written to `key.tmp-<random>`,
        then moved onto `key`, so the key holds the old bytes or the new ones, never a part.
        In a local folder no symbolic link is followed: one on the way is refused, one at the
        key itself is replaced (its target untouched)."""
        path = self._path(key)
        if isinstance(self._fs, LocalFileSystem):
            return self._put_local(key, bytes(data))
        tmp = f"{path}{_TMP}{secrets.token_hex(8)}"
        try:
            self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self._fs.pipe_file(tmp, bytes(data))
            self._fs.mv(tmp, path)
        except OSError as exc:
            self._discard(tmp)
            raise StoreError("artifact_store", f"cannot write {key} to {self.url}: {exc}") from exc

    def _put_local(self, key: str, data: bytes) -> None:
        parts = key.split("/")
        try:
            os.makedirs(self._root or "/", exist_ok=True)  # the operator's own path
            fd = os.open(self._root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError("artifact_store", f"cannot write {key} to {self.url}: {exc}") from exc
        try:
            for i, name in enumerate(parts[:-1]):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
                if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    at = "/".join(parts[: i + 1])
                    raise StoreError(
                        "artifact_store",
                        f"cannot write {key} to {self.url}: {at} is a symbolic link; "
                        "links in the store are not followed",
                    )
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                child = os.open(name, flags, dir_fd=fd)
                os.close(fd)
                fd = child
            tmp = f"{parts[-1]}{_TMP}{secrets.token_hex(8)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(tmp, flags, 0o666, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    f.write(data)
                os.replace(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)  # a link: replaced
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
        except OSError as exc:
            raise StoreError("artifact_store", f"cannot write {key} to {self.url}: {exc}") from exc
        finally:
            os.close(fd)

    def _discard(self, path: str) -> None:
        try:
            if self._fs.exists(path):
                self._fs.rm(path)
        except OSError:
            pass  # the write failed already; a stray temporary is never listed

    def get(self, key: str, max_bytes: int) -> bytes:
        """The bytes under `key`; `CheckpointError("checkpoint", ...)` when there are none,
        they cannot be read, or they are more than `max_bytes`. In a local folder the key is
        opened beneath the root one part at a time with no symbolic link followed, and only
        a regular file is read (checked on its descriptor: a FIFO never blocks)."""
        path = self._path(key)
        if isinstance(self._fs, LocalFileSystem):
            return self._get_local(key, max_bytes)
        try:
            size = int(self._fs.size(path))
            if size > max_bytes:
                raise self._too_big(key, size, max_bytes)
            f = self._fs.open(path, "rb")
        except FileNotFoundError as exc:
            raise CheckpointError("checkpoint", f"{key} is not in {self.url}") from exc
        except OSError as exc:
            reason = f"cannot read {key} from {self.url}: {exc}"
            raise CheckpointError("checkpoint", reason) from exc
        with f:
            return self._read_at_most(f, key, max_bytes)

    def _too_big(self, key: str, size: int, max_bytes: int) -> CheckpointError:
        reason = f"{key} in {self.url} holds {size} bytes, more than the limit {max_bytes}"
        return CheckpointError("checkpoint", reason)

    def _read_at_most(self, f: Any, key: str, max_bytes: int) -> bytes:
        """`f`'s bytes, refused when there are more than `max_bytes` (a file that grew
        between its size and the read)."""
        try:
            data: bytes = f.read(max_bytes + 1)
        except OSError as exc:
            reason = f"cannot read {key} from {self.url}: {exc}"
            raise CheckpointError("checkpoint", reason) from exc
        if len(data) > max_bytes:
            raise CheckpointError(
                "checkpoint", f"{key} in {self.url} holds more than the limit of {max_bytes} bytes"
            )
        return data

    def _get_local(self, key: str, max_bytes: int) -> bytes:
        parts = key.split("/")
        try:
            fd = os.open(self._root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointError("checkpoint", f"{key} is not in {self.url}: {exc}") from exc
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        for i, name in enumerate(parts):
            try:
                child = os.open(name, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: the BSDs' answer
                    at = "/".join(parts[: i + 1])
                    reason = (
                        f"{key} in {self.url} is a symbolic link (at {at}); "
                        "links in the store are not followed"
                    )
                elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    reason = f"{key} is not in {self.url}"
                else:
                    reason = f"cannot read {key} from {self.url}: {exc}"
                raise CheckpointError("checkpoint", reason) from exc
            finally:
                os.close(fd)
            fd = child
            st = os.fstat(fd)
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                os.close(fd)
                raise CheckpointError("checkpoint", f"{key} is not in {self.url}")
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError("checkpoint", f"{key} in {self.url} is not a regular file")
            raise self._too_big(key, st.st_size, max_bytes)
        with os.fdopen(fd, "rb") as f:
            return self._read_at_most(f, key, max_bytes)

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return bool(self._fs.exists(path)) and bool(self._fs.isfile(path))

    def delete(self, key: str) -> None:
        """Remove `key` (a missing key is fine)."""
        path = self._path(key)
        if self._fs.isfile(path):
            self._fs.rm(path)

    def delete_prefix(self, prefix: str) -> None:
        """Remove `prefix` itself and every key under `prefix/` (none is fine)."""
        path = self._path(prefix)
        if self._fs.exists(path):
            self._fs.rm(path, recursive=True)

    def keys(self, prefix: str | None = None) -> list[str]:
        """Every key under `prefix/` (None: the whole store), sorted; writes in progress
        (`put`'s temporaries) are not keys."""
        base = self._path(prefix) if prefix is not None else self._root
        if not self._fs.exists(base):
            return []
        found = []
        for path in self._fs.find(base):
            key = posixpath.relpath(path, self._root)
            if not _TMP_NAME.search(key):
                found.append(key)
        return sorted(found)

    def check(self) -> None:
        """Write, read back and delete a probe; `StoreError("artifact_store", ...)` when the
        store cannot be reached, written or read."""
        key = f"probe-{secrets.token_hex(8)}"
        data = secrets.token_bytes(16)
        try:
            self.put(key, data)
            back = self.get(key, len(data))
            self.delete(key)
        except (StoreError, CheckpointError, OSError) as exc:
            reason = exc.reason if isinstance(exc, CostInputError) else str(exc)
            raise StoreError("artifact_store", reason) from exc
        if back != data:
            raise StoreError("artifact_store", f"{self.url} gave back other bytes than written")
