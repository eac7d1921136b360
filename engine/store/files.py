"""Small files that must never be half-written: configs are replaced whole, durably; folder fsyncs."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Writes a temporary file, fsyncs it, renames it over `path` and fsyncs the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{abs(hash(path.name)):x}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Makes the folder's entries (a rename, an unlink) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
