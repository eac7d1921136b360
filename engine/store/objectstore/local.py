"""The object-store interface on a local folder: the embedded warehouse, same semantics as S3.

How each promise of `ObjectStore` is kept on a POSIX file system:
- Whole-object atomicity: every write goes to a temporary sibling (`.jl-tmp-…`), is fsynced, and is
  renamed (`put`, `replace`) or hard-linked (`create`) over the key, then the folder is fsynced.
- `create` is `link(2)`, which fails with EEXIST when the name exists: the O_EXCL of whole files.
- `replace` compares and renames while holding the folder's `flock`, as do `put`, `create` and
  `delete`, so a compare-and-swap is never interleaved with another write in that folder. The lock
  is held for one rename and one fsync, inside this module only; the kernel drops it if the process
  dies. (Closing the descriptor releases it.)
- A key cannot be both an object and a folder here (S3 allows `a` and `a/b`); the warehouse layout
  never needs both.
- Versions: inode, modification time and size. The modification time is set to the writer's
  nanosecond clock before the rename (the file system's own stamps are only as fine as the kernel's
  tick), so a reused inode cannot bring back an old version.
Counterpart: the `object_store` crate's LocalFileSystem, which does not offer compare-and-swap.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.store.objectstore.base import (
    DEFAULT_CHUNK_SIZE,
    TEMP_PREFIX,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    ObjectStore,
    PreconditionFailedError,
    StoredObject,
    check_key,
    check_prefix,
)


class LocalObjectStore(ObjectStore):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = str(self.root)

    def get(self, key: str) -> StoredObject:
        with self._open(key) as fd:
            st = os.fstat(fd)
            chunks = []
            while chunk := os.read(fd, DEFAULT_CHUNK_SIZE):
                chunks.append(chunk)
            return StoredObject(b"".join(chunks), _meta(key, st))

    def head(self, key: str) -> ObjectMeta:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(key)  # a folder: on S3 only a prefix, never an object
        return _meta(key, st)

    def put(self, key: str, data: bytes | Iterable[bytes]) -> ObjectMeta:
        path = self._path(key)
        tmp = self._write_temp(path, [data] if isinstance(data, bytes | bytearray | memoryview) else data)
        with _folder_lock(path.parent) as folder:
            os.rename(tmp, path)
            os.fsync(folder)
            return _meta(key, os.stat(path))

    def create(self, key: str, data: bytes) -> ObjectMeta:
        path = self._path(key)
        tmp = self._write_temp(path, [data])
        try:
            with _folder_lock(path.parent) as folder:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise ObjectExistsError(key) from None
                os.fsync(folder)
                return _meta(key, os.stat(path))
        finally:
            os.unlink(tmp)

    def replace(self, key: str, data: bytes, version: str) -> ObjectMeta:
        path = self._path(key)
        tmp = self._write_temp(path, [data])
        renamed = False
        try:
            with _folder_lock(path.parent) as folder:
                try:
                    current: str | None = _version(os.stat(path))
                except FileNotFoundError:
                    current = None
                if current != version:
                    raise PreconditionFailedError(f"{key}: version {current} is not {version}")
                os.rename(tmp, path)
                renamed = True
                os.fsync(folder)
                return _meta(key, os.stat(path))
        finally:
            if not renamed:
                os.unlink(tmp)

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not path.parent.is_dir():
            return
        with _folder_lock(path.parent) as folder:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            os.fsync(folder)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        prefix = check_prefix(prefix)
        top = self.root / prefix if prefix else self.root
        found: list[ObjectMeta] = []
        root = str(self.root)
        for folder, dirs, files in os.walk(top):  # each folder is `top` or under it, so under `root`
            dirs[:] = [d for d in dirs if not d.startswith(TEMP_PREFIX)]
            # keys by string joins, not a Path per object: a restart lists ten thousand configs
            rel = folder[len(root) + 1 :].replace(os.sep, "/")
            base = rel + "/" if rel else ""
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    continue
                try:
                    st = os.stat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                found.append(_meta(base + name, st))
        found.sort(key=lambda meta: meta.key)
        return iter(found)

    def delete_prefix(self, prefix: str) -> int:
        """The folder goes whole (one `rmtree`, not a fsynced unlink per object)."""
        prefix = check_prefix(prefix)
        if not prefix:
            raise ValueError("refusing to delete the whole warehouse")
        removed = sum(1 for _ in self.list(prefix))
        shutil.rmtree(self.root / prefix, ignore_errors=True)
        return removed

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"invalid range [{start}, {end})")
        with self._open(key) as fd:
            return os.pread(fd, end - start, start)

    def get_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        fd = self._open_fd(key)
        return _read_chunks(fd, chunk_size)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _open_fd(self, key: str) -> int:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ObjectNotFoundError(key)
        return fd

    @contextmanager
    def _open(self, key: str) -> Iterator[int]:
        fd = self._open_fd(key)
        try:
            yield fd
        finally:
            os.close(fd)

    def _write_temp(self, path: Path, chunks: Iterable[bytes]) -> str:
        """A complete, fsynced copy of the new bytes beside `path`, stamped with a unique version."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = str(path.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp


def _read_chunks(fd: int, chunk_size: int) -> Iterator[bytes]:
    try:
        while chunk := os.read(fd, chunk_size):
            yield chunk
    finally:
        os.close(fd)


@contextmanager
def _folder_lock(folder: Path) -> Iterator[int]:
    """Holds the folder's exclusive flock; yields the folder's descriptor (to fsync a rename in it)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _version(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _meta(key: str, st: os.stat_result) -> ObjectMeta:
    return ObjectMeta(key=key, size=st.st_size, version=_version(st), last_modified_ns=st.st_mtime_ns)
