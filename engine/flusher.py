"""The flusher: moves every stream's log (and the ack log) into the Delta tables, and says how that goes.

A background thread commits each stream every `flush_interval`, or sooner once `flush_bytes` wait,
one commit per stream (store/delta.py, store/commits.py: exactly once). A failing commit leaves its
log in place to be retried; the figures here say which tables fail, since when and with what error,
and how far the tables lag behind the logs (oldest unflushed append, unflushed bytes), for `/healthz`
and `/metrics`. Each round also heals: a stream whose log write failed is re-read from disk (its
memory had run ahead of its log) and takes writes again once its log folder does; a broken ack log
is cut back. Counterpart: the flush and sync loop of server/filestore.go (`flushLoop`, `syncBlocks`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import heap
from engine.consumers import Consumers
from engine.store.delta import DeltaStore
from engine.stream import Stream

log = logging.getLogger(__name__)

ACKS = "_system/acks"
LEASE_HELD = "commit lease held by another process (a maintenance job); retried at the next flush"
_RELOAD_BACKOFF_MAX = 30.0
HEAP_RELEASE_SECONDS = 1.0  # during a write load freed memory goes back this often: each commit round (engine/heap.py)
SETTLE_SECONDS = 2.0  # this long without a commit after some: the write load ended, its caches go (`settle`)
IDLE_RELEASE_SECONDS = 30.0  # without commits (reads only) freed memory still goes back this often


@dataclass
class FlushStats:
    commits: int = 0
    flushes: int = 0
    failures: int = 0
    last_error: str | None = None
    seconds: float = 0.0
    messages: int = 0
    lease_waits: int = 0


@dataclass
class TableHealth:
    """How committing one table's log goes: failures in a row, the last error, since when (wall clock ns)."""

    consecutive_failures: int = 0
    failures: int = 0
    last_error: str | None = None
    failing_since_ns: int | None = None
    last_success_ns: int | None = None

    def failed(self, error: str) -> None:
        self.consecutive_failures += 1
        self.failures += 1
        self.last_error = error
        if self.failing_since_ns is None:
            self.failing_since_ns = time.time_ns()

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.failing_since_ns = None
        self.last_success_ns = time.time_ns()


@dataclass
class FlushResult:
    """What one flush committed, and what it could not (`failed`: stream or table, and the error)."""

    commits: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Healing:
    next_try: float = 0.0
    backoff: float = 1.0


class Flusher:
    """The background flusher of one account. `reload` re-reads a stream from disk (JetStream's)."""

    def __init__(
        self,
        streams: Callable[[], list[Stream]],
        consumers: Consumers,
        reload: Callable[[Stream], None],
        interval: float,
    ) -> None:
        self._streams = streams
        self._consumers = consumers
        self._reload = reload
        self.interval = interval
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = FlushStats()
        self.health: dict[str, TableHealth] = {}
        self._healing: dict[str, _Healing] = {}
        self._heap_dirty = False
        self._last_commit_at: float | None = None  # since the last settle

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        heap.release()  # what recovery freed (a snapshot's decoded body, a table's read windows)
        self._thread = threading.Thread(target=self._loop, name="jetlake-flusher", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if self.flush(fold_acks=False).commits > 0:
                    self._heap_dirty, self._last_commit_at = True, time.monotonic()
            except Exception:  # keep flushing; the failure is in the figures and the log
                log.exception("flush failed")
            self._release_heap()

    def _release_heap(self) -> None:
        if self._last_commit_at is not None and time.monotonic() - self._last_commit_at >= SETTLE_SECONDS:
            self.settle()
        elif heap.release(every=HEAP_RELEASE_SECONDS if self._heap_dirty else IDLE_RELEASE_SECONDS):
            self._heap_dirty = False

    def settle(self) -> int:
        """Once a write load has ended: each stream drops its copies of what its table now holds, then
        the heap settles (cycles collected, free pages back to the OS), so the memory of the load does not
        stay with an idle gateway (nats-server drops an idle block's cache and Go's scavenger returns
        pages). Returns the cache bytes dropped."""
        dropped = 0
        for stream in self._streams():
            if isinstance(stream.store, DeltaStore) and stream.unavailable is None:
                with stream.lock:
                    dropped += stream.store.shed_caches(stream.index)
        heap.settle()
        self._heap_dirty, self._last_commit_at = False, None
        log.debug("write load over: %d bytes of caches dropped, heap settled", dropped)
        return dropped

    # -- flushing -----------------------------------------------------------------------------

    def flush(self, fold_acks: bool = True, lease_timeout: float = 0) -> FlushResult:
        """Heals what can be healed, then commits every stream's log and the ack log now.

        `fold_acks=False` (the background flusher) leaves the deletion of folded ack rows to their
        own, slower cadence (AckStore.flush)."""
        result = FlushResult()
        with self.lock:
            started = time.monotonic()
            streams = self._streams()
            self._heal(streams)
            for stream in streams:
                if stream.unavailable is None:
                    self._tick(stream.name, stream.tick)
                    result.commits += self._flush_stream(stream, lease_timeout, result)
            writable = [s for s in streams if s.unavailable is None and s.failure is None]
            self._tick("consumers", lambda: self._consumers.tick(writable))
            result.commits += self._flush_acks(fold_acks, lease_timeout, result)
            self.stats.flushes += 1
            self.stats.commits += result.commits
            self.stats.seconds += time.monotonic() - started
            if not result.failed:
                self.stats.last_error = None
        return result

    def flush_stream(self, stream: Stream) -> int:
        """Commits one stream's log now (a large upload keeps its own backlog small); 1 if it committed."""
        with self.lock:
            commits = self._flush_stream(stream, 0, FlushResult())
            self.stats.commits += commits
            return commits

    def _flush_stream(self, stream: Stream, lease_timeout: float, result: FlushResult) -> int:
        store = stream.store
        if not isinstance(store, DeltaStore) or stream.unavailable is not None:
            return 0
        health = self.health.setdefault(stream.name, TableHealth())
        job = None
        try:
            with stream.lock:
                job = store.seal(stream.index, stream.dedup_window)
            if job is None:
                if health.consecutive_failures:
                    health.succeeded()
                return 0
            store.commit(job, lease_timeout=lease_timeout)
        except TimeoutError:
            # A Spark job holds the table's lease: its messages wait in the log for the next round,
            # and the other streams are not held up.
            self._requeue(stream, job)
            self.stats.lease_waits += 1
            health.failed(LEASE_HELD)
            result.failed.append({"stream": stream.name, "table": f"streams/{stream.name}", "error": LEASE_HELD})
            return 0
        except Exception as exc:  # noqa: BLE001 - any failure: the log is kept and retried
            self._requeue(stream, job)
            self._failed(health, f"{stream.name}: {exc}")
            result.failed.append({"stream": stream.name, "table": f"streams/{stream.name}", "error": str(exc)})
            log.exception("flushing stream %s failed; its log is kept and retried", stream.name)
            return 0
        with stream.lock:
            store.finish(job, stream.index)
        health.succeeded()
        self.stats.messages += job.rows
        return 1

    @staticmethod
    def _tick(what: str, tick: Callable[[], None]) -> None:
        """Expiry and consumer timers: a failure (a refused write) must not stop the flush after it,
        which is what relieves a full backlog."""
        try:
            tick()
        except Exception as exc:  # noqa: BLE001 - retried at the next round
            log.warning("the periodic tick of %s failed (retried at the next flush): %s", what, exc)

    def forget(self, name: str) -> None:
        """A deleted stream: its figures go."""
        self.health.pop(name, None)
        self._healing.pop(name, None)

    @staticmethod
    def _requeue(stream: Stream, job: Any) -> None:
        if job is not None:
            with stream.lock:
                stream.store.requeue(job, stream.index)  # type: ignore[attr-defined]

    def _flush_acks(self, fold: bool, lease_timeout: float, result: FlushResult) -> int:
        health = self.health.setdefault(ACKS, TableHealth())
        try:
            commits = self._consumers.flush(fold, lease_timeout)
        except TimeoutError:
            self.stats.lease_waits += 1
            health.failed(LEASE_HELD)
            result.failed.append({"table": ACKS, "error": LEASE_HELD})
            return 0
        except Exception as exc:  # noqa: BLE001 - the ack log is kept and retried
            self._failed(health, f"acks: {exc}")
            result.failed.append({"table": ACKS, "error": str(exc)})
            log.exception("flushing the ack table failed; its log is kept and retried")
            return 0
        health.succeeded()
        return commits

    def _failed(self, health: TableHealth, error: str) -> None:
        health.failed(error)
        self.stats.failures += 1
        self.stats.last_error = error

    # -- healing ------------------------------------------------------------------------------

    def _heal(self, streams: list[Stream]) -> None:
        """Re-reads streams whose memory ran ahead of a failed log write; lets streams whose log folder
        takes writes again write; cuts a broken ack log back."""
        now = time.monotonic()
        for stream in streams:
            if stream.unavailable is not None:
                if stream.recovered:
                    self._try(stream, now, self._reload_stream)
            elif stream.failure is not None and isinstance(stream.store, DeltaStore):
                self._try(stream, now, self._resume)
        for acks in self._consumers.ack_stores():
            if acks.wal.broken is not None:
                acks.repair()

    def _try(self, stream: Stream, now: float, step: Callable[[Stream], bool]) -> None:
        healing = self._healing.setdefault(stream.name, _Healing())
        if now < healing.next_try:
            return
        if step(stream):
            self._healing.pop(stream.name, None)
        else:
            healing.next_try = now + healing.backoff
            healing.backoff = min(healing.backoff * 2, _RELOAD_BACKOFF_MAX)

    def _reload_stream(self, stream: Stream) -> bool:
        try:
            self._reload(stream)
        except Exception as exc:  # noqa: BLE001 - stays unavailable; retried with a backoff
            log.warning("re-reading stream %s from disk failed (retried later): %s", stream.name, exc)
            return False
        log.warning("stream %s re-read from disk after a failed write; it serves reads again", stream.name)
        return True

    @staticmethod
    def _resume(stream: Stream) -> bool:
        store = stream.store
        assert isinstance(store, DeltaStore)
        if not store.wal.probe():
            return False
        with stream.lock:
            stream.failure = None
        log.warning("stream %s takes writes again: its log folder is writable", stream.name)
        return True

    # -- figures ------------------------------------------------------------------------------

    def failing(self) -> dict[str, TableHealth]:
        """The tables whose last commit failed."""
        return {name: h for name, h in self.health.items() if h.consecutive_failures}
