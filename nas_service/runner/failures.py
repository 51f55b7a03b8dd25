"""What the service tells users about a failure, and which failures are the database's.

A reason shown to a user names what went wrong in one line: no terminal colour codes, no
worker addresses or process ids, no traceback, bounded in length. Ray wraps an exception
raised inside a task with the worker's address and the remote traceback; the user's reason
is the original exception.
"""

from __future__ import annotations

import re

from sqlalchemy import exc as sa_exc

MAX_REASON = 500
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_ADDRESS = re.compile(
    r"\(pid=\d+(, ip=[^)]*)?\)|\bpid=\d+|\bip=[\w.:\[\]-]+|"
    r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\b[0-9a-f]{28,}\b"
)


def clean(text: str, limit: int = MAX_REASON) -> str:
    """One line of `text` without colour codes, addresses, process ids or control bytes."""
    text = _ANSI.sub("", text)
    text = _ADDRESS.sub("", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    line = "".join(ch for ch in line if ch.isprintable())
    line = re.sub(r"\s{2,}", " ", line).strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """`Type: message` of the exception a user cares about (a Ray task error's cause)."""
    cause = _task_cause(exc)
    if cause is not None:
        exc = cause
    field, reason = getattr(exc, "field", None), getattr(exc, "reason", None)
    if isinstance(field, str) and isinstance(reason, str):
        return clean(f"{field}: {reason}")
    message = clean(str(exc))
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def _task_cause(exc: BaseException) -> BaseException | None:
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and not isinstance(cause, rex.RayTaskError):
            return cause
    return None


def is_database_outage(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the database being unreachable or busy: the
    operation may succeed later, and nobody's input was wrong."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError):
            return True
        if isinstance(node, sa_exc.DBAPIError) and node.connection_invalidated:
            return True
        node = node.__cause__ or node.__context__
    return False
