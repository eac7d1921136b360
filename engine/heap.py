"""The process's heap policy: how much freed memory the allocators keep, and when it goes back to the OS.

Three allocators hold what the gateway frees: glibc's malloc (Python objects, numpy arrays),
Arrow's jemalloc pool (engine/store/rows.py picks it: decoded row groups, publish batches) and, for
reference cycles, Python's cyclic collector, which the gateway runs rarely. This module is the one place
that tunes or calls them:
- `collect_rarely` (once the gateway has started) freezes what it holds and raises the thresholds;
- `keep_freed_memory` (at startup) lets glibc keep up to 16 MiB of freed memory in at most two arenas
  (a heap per thread of the pool left each its own free pages), so a megabyte request
  body allocated and freed many times a second is not handed back and faulted in page by page
  (64 MiB kept 30-50 MB more above the live heap right after a load of a million subjects); makes
  Arrow's jemalloc decay freed pages over 0.1 s (with its default, the ~57 MB of table buffers of a
  flush of a million subjects stayed resident after the load: settled RSS 324 MB, 272 with it); and
  keeps numpy's arrays off transparent huge pages (numpy asks for them on every array of 4 MB and
  more; where the kernel grants them only on request, as here, the heap ranges such arrays leave were
  refilled 2 MB at a time: 40-90 MB of huge pages after a load of a million subjects, 10-16 without);
- `release` (the flusher: after each commit round of a write load, now and then otherwise) gives free
  pages back: `malloc_trim` for glibc, `release_unused` for Arrow's pool;
- `settle` (the flusher, once a write load ends) collects cycles first, then releases.
nats-server's counterpart is Go's garbage collector and scavenger, which return memory on their own.
Where the C library is not glibc (musl, macOS) the glibc calls do nothing.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import sys
import threading
import time
from typing import Any

import pyarrow as pa
from numpy._core import multiarray as np_multiarray

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc mallopt parameters
KEEP_FREED_BYTES = 16 * 1024 * 1024
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
ARENA_MAX = 2
# Arrow's jemalloc decays freed pages over 0.1 s (dirty ones, then lazily freed "muzzy" ones, which still
# count in the RSS); jemalloc decays as the process allocates, and `release` purges the rest. The pages a
# publish load reuses at once stay: 0 cost the NATS door's async publishes ~1.5 us of CPU a message, 100
# nothing measurable. It applies to the arenas made after it is set (at startup, before the engine's).
ARROW_DECAY_MS = 100


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _load_libc()
_lock = threading.Lock()
_released_at = -math.inf  # monotonic time of the last release


def keep_freed_memory() -> bool:
    """Request bodies of a megabyte, allocated and freed many times a second: glibc would hand each back
    to the kernel (munmap, heap trim) and fault it in again page by page, which costs a third of the
    gateway's CPU on a VM. Keeps up to 16 MiB of freed memory for reuse (`release` still hands it back
    when the flusher asks); Arrow's pool decays what it frees over 0.1 s; numpy's arrays stay on small pages
    (NUMPY_MADVISE_HUGEPAGE=1 overrides). MALLOC_* variables override glibc's part. True if the glibc
    policy was applied."""
    if os.environ.get("NUMPY_MADVISE_HUGEPAGE") is None:
        np_multiarray._set_madvise_hugepage(False)
    if pa.default_memory_pool().backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(ARROW_DECAY_MS)
    if _LIBC is None or any(name.startswith("MALLOC_") for name in os.environ):
        return False
    _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    _LIBC.mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    _LIBC.mallopt(_M_ARENA_MAX, ARENA_MAX)
    return True


def collect_rarely() -> None:
    """Publishing allocates many short-lived objects: the cyclic collector runs less often, and not over
    what the gateway holds from its start (frozen); `settle` runs a full collection when a load ends."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def release(every: float = 0.0) -> bool:
    """Returns free pages to the OS: glibc's heaps (ctypes drops the GIL meanwhile) and Arrow's pool;
    not if the process did so less than `every` seconds ago (the heap is the process's, and each
    account's flusher asks: a trim walks the whole heap, ~30 ms for a gateway of 300 MB). True if it ran."""
    global _released_at
    with _lock:
        now = time.monotonic()
        if now - _released_at < every:
            return False
        _released_at = now
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def stats() -> dict[str, int]:
    """What each allocator holds, in bytes, for /metrics: glibc's heaps (in use, free but kept, mmapped)
    across its arenas and Arrow's pool. RSS minus these is the mapped code, Python's small-object arenas
    and the few allocations of other libraries' own allocators."""
    out = {"arrow_allocated": pa.total_allocated_bytes()}
    if _LIBC is not None and hasattr(_LIBC, "mallinfo2"):
        _LIBC.mallinfo2.restype = _MallInfo2
        info = _LIBC.mallinfo2()
        out.update(glibc_in_use=info.uordblks + info.hblkhd, glibc_free=info.fordblks, glibc_mmapped=info.hblkhd)
    return out


def settle() -> int:
    """After a load: frees the reference cycles the rarely run collector left (a full collection of what
    is not frozen), then releases. Returns the objects collected."""
    collected = gc.collect()
    release()
    return collected
