"""The C heap of a training process: keep freed memory for the next step (glibc only).

A training step frees and allocates the same large tensors again every step. By default
glibc serves a block above its (adaptive) mmap threshold with a fresh mapping and unmaps it
on free, and trims the top of the heap: the next step faults every page in again, and the
kernel zeroes each one. At the benchmark shape (L_b = 8, d = 256, T = 256, batch 8, CPU)
that is about 2,500 page faults per training step for the standard residual and 6,000–10,000
for AttnRes and mHC-lite, whose sources and stream states are larger: a cost of the
allocator, not of the arithmetic. `for_training` makes the heap serve blocks up to
`MMAP_THRESHOLD` and keep up to `TRIM_THRESHOLD` of free memory, so a step reuses the pages
of the one before (measured: from thousands of faults per step to a handful). `release`
hands the free memory back (`malloc_trim`): the trainer calls it before each run, so a
run's peak resident memory is its own and not an earlier, larger candidate's.

Elsewhere (another C library, another OS) both are no-ops and report False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import threading

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20

_lock = threading.Lock()
_tuned = False


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def for_training() -> bool:
    """Serve large blocks from the heap and keep freed memory (once per process); True when
    the C library took every setting."""
    global _tuned
    with _lock:
        if _tuned:
            return True
        libc = _libc()
        if libc is None:
            return False
        settings = (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
        )
        _tuned = all(libc.mallopt(param, value) == 1 for param, value in settings)
        return _tuned


def release() -> bool:
    """Give the heap's free memory back to the OS; True when some was."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
