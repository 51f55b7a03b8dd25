"""AttnRes decoding on the CPU with compiled kernels (the two-phase schedule's online form:
Block AttnRes, and Full AttnRes as its S = 1 case): `OnlineDepth`'s arithmetic fused per
token (`online_depth.c`), built with the machine's C compiler on first use.

Why: a decoding step on a CPU is bound by the number of operations, and after every
Transformer sublayer (whose weights stream through the cache) each further operation starts
cold. `OnlineDepth` needs six tensor operations per merge and about fifteen per push; here
each is one call into a loop over the tokens.

The library is built once per source, compiler and machine into a cache folder
(`$DEPTHSCOPE_CACHE`, else `$XDG_CACHE_HOME/depthscope`, else `~/.cache/depthscope`), written
to a temporary name and renamed, so concurrent processes never load a half-written file.
Where it cannot be built (no compiler, a cache folder that cannot be made) or with
`DEPTHSCOPE_NATIVE=0`, `kernels()` is None and the torch operations of `OnlineDepth` serve,
after one warning (none for the switch). There is no shared fallback folder: a library found
in one could be anybody's. CPU tensors in fp32 or fp64 only;
every other device and dtype takes `OnlineDepth`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from workers.model.depth_attention import SOFTPLUS_EXACT, ScaledQueries

SOURCE = Path(__file__).with_name("online_depth.c")
FLAGS = ("-O3", "-std=c99", "-fPIC", "-shared")
ENV_SWITCH = "DEPTHSCOPE_NATIVE"
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_P, _L, _D = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
_SIGNATURES = {
    "init": [_P, _P, _P, _D, _L, _L, _L],
    "merge": [_P, _P, _P, _P, _D, _P, _L, _L],
    "push": [_P, _P, _P, _P, _L, _P, _D, _D, _L, _L, _L],
}


class Kernels:
    """The compiled library's functions per dtype: `of(dtype).init/merge/push`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._by_dtype = {}
        for dtype, suffix in _SUFFIX.items():
            fns = {}
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, f"depth_{name}_{suffix}")
                fn.argtypes, fn.restype = argtypes, None
                fns[name] = fn
            self._by_dtype[dtype] = _DtypeKernels(**fns)

    def of(self, dtype: torch.dtype) -> _DtypeKernels:
        return self._by_dtype[dtype]


class _DtypeKernels:
    __slots__ = ("init", "merge", "push")

    def __init__(self, init: Any, merge: Any, push: Any) -> None:
        self.init, self.merge, self.push = init, merge, push


def cache_dir() -> Path:
    explicit = os.environ.get("DEPTHSCOPE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "depthscope"


def compiler() -> str:
    return os.environ.get("CC", "cc")


def build(folder: Path | None = None) -> Path:
    """The compiled library for this source, compiler and machine: built if missing (raises
    `RuntimeError` with the compiler's message when it cannot be)."""
    cc = compiler()
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join((cc, *FLAGS, platform.machine(), platform.system())).encode())
    folder = folder or cache_dir()
    target = folder / f"online_depth-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(f"cache folder {folder}: {exc} (set DEPTHSCOPE_CACHE)") from exc
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", str(partial), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{cc}: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{cc} exited with {done.returncode}: {done.stderr.strip()[:500]}")
    os.replace(partial, target)
    return target


@functools.cache
def kernels() -> Kernels | None:
    """The kernels, built and loaded once per process; None where they cannot be (warned
    once) or are switched off (`DEPTHSCOPE_NATIVE=0`)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    try:
        return Kernels(build())
    except (RuntimeError, OSError) as exc:
        warnings.warn(
            f"native depth kernels unavailable, decoding uses torch operations: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


_off = 0  # depth of `disabled()` contexts


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within: decoding uses torch operations (`OnlineDepth`) even where the kernels serve
    (to compare the two, as bench/variants.py does)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def serves(queries: ScaledQueries, first: torch.Tensor) -> bool:
    """Whether `NativeDepth` takes this input: CPU, fp32 or fp64 as the queries, kernels
    present, not `disabled()`."""
    return (
        not _off
        and first.is_cpu
        and first.dtype is queries.Qs.dtype
        and first.dtype in _SUFFIX
        and kernels() is not None
    )


class _Plan:
    """What a pass needs besides its tensors, derived once per scaled queries, dtype and
    input shape: the kernels and the pointers and sizes they take."""

    __slots__ = ("c", "d", "fns", "nlse_row", "q_ptr", "q_row", "rows", "shape", "slot", "uses")

    def __init__(self, queries: ScaledQueries, first: torch.Tensor) -> None:
        lib = kernels()
        assert lib is not None
        self.fns = lib.of(first.dtype)
        self.uses, self.d = queries.Qs.shape
        B, T, _ = first.shape
        self.shape, self.rows, self.c = (B, T, self.d), B * T, queries.c_value
        size = first.element_size()
        self.q_ptr, self.q_row = queries.Qs.data_ptr(), self.d * size
        self.nlse_row, self.slot = self.rows * size, self.rows * self.d * size


class NativeDepth:
    """`OnlineDepth` (same interface, same arithmetic: see its docstring) on the compiled
    kernels. Every merge for a sublayer writes into its own slot of one (U − 1, B, T, d)
    buffer, so the inputs it returns stay valid for the whole pass; the aggregation's (the
    pass's result) is a tensor of its own, so that keeping it keeps nothing else alive. The
    state o is made by the first push, as there. Memory: about twice `OnlineDepth`'s."""

    def __init__(self, queries: ScaledQueries, first: torch.Tensor) -> None:
        key = (first.dtype, first.shape)
        plan = queries.derived.get(key)
        if plan is None:
            plan = queries.derived[key] = _Plan(queries, first)
        self.plan, self.queries = plan, queries  # (the queries: the kernels read them)
        self.first = first = first.contiguous()
        dtype = self.dtype = first.dtype
        self.nlse = torch.empty((plan.uses, plan.rows), dtype=dtype)
        self.out = torch.empty((plan.uses - 1, *plan.shape), dtype=dtype)
        self.outs = self.out.unbind(0)
        first_ptr = first.data_ptr()
        plan.fns.init(
            first_ptr,
            queries.neg.data_ptr(),
            self.nlse.data_ptr(),
            plan.c,
            plan.uses,
            plan.rows,
            plan.d,
        )
        self.inputs: list[torch.Tensor] = [first] * plan.uses
        self.in_ptrs = [first_ptr] * plan.uses
        self.o: torch.Tensor | None = None

    def input(self, use: int) -> torch.Tensor:
        return self.inputs[use]

    def merged(self, use: int, p: torch.Tensor) -> torch.Tensor:
        if p.dtype is not self.dtype or not p.is_contiguous():
            p = p.to(self.dtype).contiguous()
        plan = self.plan
        last = use == plan.uses - 1
        h = torch.empty(plan.shape, dtype=self.dtype) if last else self.outs[use]
        plan.fns.merge(
            self.in_ptrs[use],
            p.data_ptr(),
            plan.q_ptr + use * plan.q_row,
            self.nlse.data_ptr() + use * plan.nlse_row,
            plan.c,
            h.data_ptr() if last else self.out.data_ptr() + use * plan.slot,
            plan.rows,
            plan.d,
        )
        return h

    def push(self, value: torch.Tensor, first_use: int) -> None:
        f, plan = first_use, self.plan
        v = value
        if v.dtype is not self.dtype or not v.is_contiguous():
            v = v.to(self.dtype).contiguous()
        if self.o is None:  # every later use's state so far is the first source
            self.o = torch.empty((plan.uses - f, *plan.shape), dtype=self.dtype)
            base, stride = self.in_ptrs[f], 0  # the first source, for every use
            views = self.o.unbind(0)
            self.inputs[f:] = views
            self.in_ptrs[f:] = [x.data_ptr() for x in views]
        else:  # in place
            base, stride = self.in_ptrs[f], plan.rows * plan.d
        plan.fns.push(
            v.data_ptr(),
            plan.q_ptr + f * plan.q_row,
            self.nlse.data_ptr() + f * plan.nlse_row,
            base,
            stride,
            self.in_ptrs[f],
            plan.c,
            SOFTPLUS_EXACT,
            plan.uses - f,
            plan.rows,
            plan.d,
        )
