"""The warehouse owner lease and the per-table commit lease, on the object store's conditional writes.

One gateway owns a warehouse's streams: a second one is refused, not left racing. And one committer
at a time per table: Spark's Delta log store excludes no other process (on local disk or S3), and a
Spark DELETE conflicts with appends to the partitions it reads, so the gateway's flusher and the
Spark jobs take the table's lease around each commit. Both are `Lease`s (engine/store/leases.py) on
the warehouse's `ObjectStore`, the same code on a local folder and on S3, kept renewed by a thread
while held. A holder killed by `kill -9` leaves its record behind: the next taker waits for it to
expire, unless the record names a process of this machine that no longer runs (same boot, same PID
namespace, PID gone), which is taken over at once, as the kernel released a `flock` before.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

from engine.store.layout import CommitLeaseRef, Layout
from engine.store.leases import Lease, LeaseHeldError, LeaseLostError, LeaseRecord
from engine.store.objectstore import ObjectStoreError

log = logging.getLogger(__name__)

OWNER_TTL_NS = 15_000_000_000
COMMIT_TTL_NS = 30_000_000_000
_FOREVER = 365 * 24 * 3600.0
_key_locks: dict[str, threading.Lock] = {}  # one per commit lease key: threads of this process queue here
_locks_lock = threading.Lock()


class OwnerLockedError(RuntimeError):
    """Another process already owns this warehouse."""


@lru_cache(maxsize=1)
def _machine() -> str:
    """This machine and PID namespace: the scope in which a holder's PID can be checked."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""  # no way to check: holders are never declared dead, only expired
    return f"{socket.gethostname()}|{boot}|{namespace}"


def holder_id() -> str:
    """This process's lease owner id: machine scope, PID and a random part (a reused PID is another owner)."""
    return f"{_machine()}|{os.getpid()}|{_process_nonce(os.getpid())}"


@lru_cache(maxsize=4)
def _process_nonce(pid: int) -> str:
    return uuid.uuid4().hex[:12]


def holder_is_dead(record: LeaseRecord) -> bool:
    """True if the record's holder was a process of this machine that is gone (or a zombie)."""
    scope, _, rest = record.owner.rpartition("|")  # rest: the nonce
    scope, _, pid_text = scope.rpartition("|")
    machine = _machine()
    if not machine or scope != machine or not pid_text.isdigit():
        return False
    try:
        with open(f"/proc/{pid_text}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        return False


class _Renewer:
    """Renews a held lease every third of its TTL until stopped; `on_lost` is told if it is lost."""

    def __init__(self, lease: Lease, on_lost: Callable[[str], None] | None = None) -> None:
        self.lease = lease
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease {lease.key}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease.ttl_ns / 3e9):
            try:
                self.lease.renew()
            except LeaseLostError as exc:
                log.error("lease %s lost: %s", self.lease.key, exc)
                if self.on_lost is not None:
                    self.on_lost(str(exc))
                return
            except (ObjectStoreError, OSError) as exc:  # no answer, a full disk: the next renewal may pass
                log.warning("lease %s not renewed (%s); retrying", self.lease.key, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


class OwnerLock:
    """The warehouse account's owner lease, held and renewed for as long as the engine is open."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.lease = Lease(layout.objects, layout.owner_key, holder_id(), OWNER_TTL_NS)
        self.on_lost: Callable[[str], None] | None = None
        self._renewer: _Renewer | None = None

    def acquire(self, wait: float = 0.0) -> None:
        """Takes the warehouse, waiting up to `wait` seconds for a holder's lease to expire (a standby
        gateway taking over). Raises OwnerLockedError when another live gateway still holds it."""
        deadline = time.monotonic() + wait
        waiting = False
        while not self.lease.try_acquire(breakable=holder_is_dead):
            if time.monotonic() < deadline:
                if not waiting:
                    log.info("waiting up to %.0fs for the gateway that owns %s to go", wait, self.layout)
                    waiting = True
                time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
                continue
            holder = self.lease.holder()
            raise OwnerLockedError(
                f"another JetLake gateway ({holder.owner if holder else 'unknown'}) already owns the warehouse "
                f"at {self.layout}; stop it first or use another --warehouse"
            )
        self._renewer = _Renewer(self.lease, self.on_lost)

    def fence(self) -> int:
        """The owner's token while the lease is trusted. Raises LeaseLostError."""
        return self.lease.fence()

    def release(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        try:
            self.lease.release()
        except (ObjectStoreError, OSError) as exc:  # it expires by itself
            log.warning("owner lease %s not released: %s", self.lease.key, exc)


@contextmanager
def commit_lease(ref: CommitLeaseRef, timeout: float | None = None, poll: float = 0.05) -> Iterator[int]:
    """Holds a table's commit lease (from `Layout.lease_file`); waits for it up to `timeout` seconds
    (forever when None). Yields the lease's fencing token.

    Threads of one process first take the key's in-process lock, so the lease object only decides
    between processes; holding that lock, a record of this process's own is a leftover (a release
    that failed, on a full disk say) and is taken back at once.

    Raises TimeoutError when it stays taken.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    local = _key_lock(ref.key)
    if not local.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
        raise TimeoutError(f"commit lease {ref.key} is held by another thread of this process")
    try:
        lease = Lease(ref.store, ref.key, holder_id(), COMMIT_TTL_NS)
        left = _FOREVER if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            token = lease.acquire(left, poll, breakable=lambda r: r.owner == lease.owner or holder_is_dead(r))
        except LeaseHeldError as exc:
            raise TimeoutError(f"commit lease {ref.key} is held by another process: {exc}") from None
        renewer = _Renewer(lease)
        try:
            yield token
        finally:
            renewer.stop()
            try:
                lease.release()
            except (ObjectStoreError, OSError) as exc:
                log.warning("commit lease %s not released (it expires, or this process takes it back): %s",
                            ref.key, exc)
    finally:
        local.release()


def _key_lock(key: str) -> threading.Lock:
    with _locks_lock:
        return _key_locks.setdefault(key, threading.Lock())
