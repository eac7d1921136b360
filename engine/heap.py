"""Gives the process's freed heap memory back to the operating system.

glibc's malloc keeps what Python, numpy, Arrow and delta-rs free inside its heaps (one per thread that
allocates) instead of returning it: after a million new subjects went through publish batches and
flushes, ~150 MB of a gateway's RSS was free memory, which `malloc_trim` hands back in ~15 ms. nats-server
has a garbage collector that returns memory; this is our counterpart, called by the flusher now and then.
Where the C library has no `malloc_trim` (musl, macOS) `release` does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _load_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_TRIM = _load_trim()


def release() -> bool:
    """Returns free heap pages to the OS (ctypes drops the GIL meanwhile); True if any went back."""
    return bool(_TRIM(0)) if _TRIM is not None else False
