"""Process helpers for the tests: they find and stop only processes the test started.

Everything goes through the process tree of a process we started (or of this test process,
for the in-process Ray a module fixture starts with `ray.init`): never a scan of every
process on the machine, never a match on a name alone, so another Ray, service or database
on the same machine is never touched.

What the tree holds (checked with psutil on Ray 2.60, Linux): `ray.init` in a process
starts gcs_server, raylet, the monitors and the dashboard agents as its children, and the
workers as children of the raylet: all descendants, all in the session of the process that
called `ray.init`. The workers each get a process group of their own, so a `killpg` of the
service's group alone would leave them behind: `kill_session` kills the group and every
descendant. PostgreSQL's backends call setsid(): they are the postmaster's children, in
sessions of their own.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:  # not a declared dependency: Ray ships a copy and puts it on sys.path
        importlib.import_module("ray")

        import psutil
    return psutil


psutil = _psutil()


def descendants(pid: int | None = None) -> list[Any]:
    """Every live descendant of `pid` (default: this process), as psutil processes."""
    try:
        return list(psutil.Process(os.getpid() if pid is None else pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def cmdline_contains(text: str) -> Callable[[Any], bool]:
    """A predicate: the process's command line (Ray sets it to `ray::<task>`) holds `text`."""

    def match(proc: Any) -> bool:
        return any(text in part for part in proc.cmdline())

    return match


def find_in_tree(root_pid: int | None, predicate: Callable[[Any], bool]) -> list[Any]:
    """The descendants of `root_pid` (default: this process) for which `predicate` holds."""
    found = []
    for proc in descendants(root_pid):
        try:
            if predicate(proc) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_in_tree(
    root_pid: int | None, predicate: Callable[[Any], bool], timeout: float, poll: float = 0.2
) -> list[Any]:
    """`find_in_tree` until it finds something or `timeout` seconds pass ([] then)."""
    deadline = time.monotonic() + timeout
    while True:
        found = find_in_tree(root_pid, predicate)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(poll)


def _signal(procs: Iterable[Any], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks the pid still names the same process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def _still_alive(procs: Iterable[Any]) -> list[Any]:
    """The processes of `procs` still running (a zombie counts as gone)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_gone(procs: Iterable[Any], timeout: float = 30.0) -> list[Any]:
    """Wait until every process of `procs` has exited; the ones still alive after `timeout`."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        alive = _still_alive(procs)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _freeze_tree(pid: int | None, include_root: bool) -> list[Any]:
    """SIGSTOP the root (when included) and its descendants until the tree stops growing: a
    stopped process cannot fork, so nothing escapes the SIGKILL that follows."""
    me = os.getpid()
    roots = []
    if include_root and pid is not None and pid != me:
        try:
            roots = [psutil.Process(pid)]
        except psutil.NoSuchProcess:
            roots = []
    seen: dict[int, Any] = {}
    for _ in range(20):
        current = [p for p in roots + descendants(pid) if p.pid != me]
        new = [p for p in current if p.pid not in seen]
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        seen.update((p.pid, p) for p in new)
    return list(seen.values())


def kill_tree(pid: int | None, include_root: bool = True, timeout: float = 30.0) -> list[int]:
    """SIGKILL `pid` (a process we started; with `None` or our own pid only our descendants)
    and all its descendants, and wait until they have exited. Returns the pids killed."""
    procs = _freeze_tree(pid, include_root)
    _signal(procs, signal.SIGKILL)
    alive = wait_gone(procs, timeout)
    if alive:
        raise RuntimeError(f"still alive {timeout}s after SIGKILL: {[p.pid for p in alive]}")
    return [p.pid for p in procs]


def kill_group(pgid: int, timeout: float = 30.0) -> list[int]:
    """SIGKILL the process group `pgid` (one we created with `start_new_session=True`: its
    leader's pid) and every descendant of its leader, in whatever group they moved to."""
    procs = _freeze_tree(pgid, include_root=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _signal(procs, signal.SIGKILL)
    alive = wait_gone(procs, timeout)
    if alive:
        raise RuntimeError(f"still alive {timeout}s after SIGKILL: {[p.pid for p in alive]}")
    return [p.pid for p in procs]


def _exited_unreaped(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait up to `timeout` s for `proc` to exit without reaping it: while it is a zombie its
    pid (so its process group's id) cannot name another process."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already (by Popen)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def exited(proc: subprocess.Popen[Any]) -> bool:
    """Whether `proc` has exited, without reaping it (use this, not `poll()`, on a session
    leader that `kill_session` should still be able to clean up after)."""
    return proc.returncode is not None or _exited_unreaped(proc, 0)


def kill_session(proc: subprocess.Popen[Any], timeout: float = 30.0) -> list[int]:
    """Stop a process started with `start_new_session=True` and everything it started: its
    process group, and every descendant (Ray's workers sit in groups of their own). Reaps
    `proc` and checks that none of them is left. A `proc` reaped before is left alone: its
    pid, and so the group id, may name another process by now."""
    if proc.returncode is not None:
        return []
    killed = kill_group(proc.pid, timeout)  # alive or a zombie: the group id is still ours
    proc.wait(timeout=timeout)
    return killed


def terminate_session(proc: subprocess.Popen[Any], grace: float = 30.0) -> list[int]:
    """SIGTERM `proc` (started with `start_new_session=True`) and let it stop what it started
    (`depthscope serve` stops its runner, which shuts its Ray down); once it has exited, or
    after `grace` seconds, SIGKILL whatever is left of its group and of its tree (a snapshot
    taken first). Returns the pids of the tree."""
    if proc.returncode is not None:
        return []
    tree = [*descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    if _exited_unreaped(proc, grace):
        wait_gone(tree, timeout=5)  # what it stopped on its way out
    killed = kill_session(proc)  # its group (the id is still ours: not reaped) and its tree
    left = _still_alive(tree)
    _signal(left, signal.SIGKILL)
    alive = wait_gone(left, timeout=10)
    if alive:
        raise RuntimeError(f"still alive after SIGKILL: {[p.pid for p in alive]}")
    return sorted({proc.pid, *killed, *(p.pid for p in tree)})
