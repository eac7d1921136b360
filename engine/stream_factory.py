"""Making a stream from its config record: the store its storage asks for (memory, or a Delta table and
its log, sealed when the stream is encrypted, fenced by the warehouse's or the stream's own lease),
its recovery from disk, and a reload after a failed log write. A stream whose recovery fails is made
again empty and kept apart (every request on it is a 503) so that the account's other streams serve.
Counterpart: server/stream.go `addStream` and server/filestore.go `newFileStoreWithCreated`.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from engine import encryption
from engine.catalog import StreamRecord, stream_key_tokens, stream_protected
from engine.clock import Clock
from engine.config import StreamConfig
from engine.keys import Keyring
from engine.store.backlog import Backlog
from engine.store.base import StreamStore
from engine.store.delta import DeltaStore
from engine.store.layout import Layout
from engine.store.leases import Lease
from engine.store.memory import MemoryStore
from engine.store.tombstones import TombstoneView
from engine.stream import Quota, Stream

log = logging.getLogger(__name__)


class StreamFactory:
    """Makes and recovers an account's streams. `keyring` is set once the engine opens it; `quota` is
    the account's byte check, set while the account limits its bytes (every publish sums every stream's)."""

    def __init__(self, layout: Layout, clock: Clock, backlog: Backlog, log_lease: Lease | None, *,
                 sync_always: bool, cache_bytes: int, max_payload: int) -> None:
        self.layout = layout
        self.clock = clock
        self.backlog = backlog
        self.log_lease = log_lease  # `--wal object`: the owner lease's token fences every log
        self.sync_always = sync_always
        self.cache_bytes = cache_bytes
        self.max_payload = max_payload
        self.keyring: Keyring | None = None
        self.quota: Quota | None = None

    def recover(self, record: StreamRecord, lease: Lease | None, tombstones: TombstoneView | None) -> Stream:
        """Recovers one stream (`tombstones`: the account's, read once for many); a stream that cannot be
        recovered is kept apart, refusing every request."""
        config, tokens, key_tokens, protected = record.config, record.partition_tokens, record.key_tokens, record.protected
        started = time.monotonic()
        stream = self.new_stream(config, record.created_ns, record.stream_id, tokens, key_tokens, protected, lease,
                                 tombstones)
        try:
            stream.recover()
        except Exception as exc:  # noqa: BLE001 - one bad stream must not keep the others from serving
            log.exception("stream %s cannot be recovered; it refuses every request until a restart recovers it",
                          config.name)
            try:
                stream.store.close()
            except OSError:
                pass  # what it read is dropped with it
            stream = self.new_stream(config, record.created_ns, record.stream_id, tokens, key_tokens, protected, lease)
            stream.unavailable = stream.failure = f"recovery failed: {type(exc).__name__}: {exc}"
            stream.recovered = False
        log.info(
            "recovered stream %s: %d messages, last seq %d, in %.2fs",
            config.name, stream.index.msgs, stream.index.last_seq, time.monotonic() - started,
        )
        return stream

    def new_stream(self, config: StreamConfig, created: int, stream_id: str, partition_tokens: int,
                   key_tokens: int | None = None, protected: bool = False, lease: Lease | None = None,
                   tombstones: TombstoneView | None = None) -> Stream:
        store = self.new_store(config, stream_id, partition_tokens, key_tokens, protected, lease, tombstones)
        stream = Stream(config, created, stream_id, store, self.clock, self.max_payload)
        stream.quota = self.quota
        return stream

    def new_store(self, config: StreamConfig, stream_id: str, partition_tokens: int, key_tokens: int | None = None,
                  protected: bool = False, lease: Lease | None = None,
                  tombstones: TombstoneView | None = None) -> StreamStore:
        """A stream's store; `partition_tokens` is fixed when the stream is made (its table keeps its
        layout), as is whether it is encrypted (`key_tokens` not None) and its subjects protected."""
        if config.storage == "memory":
            return MemoryStore(partition_tokens)
        return DeltaStore(
            self.layout, config.name, stream_id, partition_tokens,
            self.sync_always, self.cache_bytes, self.backlog, tombstones=tombstones,
            sealer=encryption.sealer(self.keyring, config.name, stream_id, key_tokens, protected),
            log_lease=lease or self.log_lease, stream_lease=lease is not None,
        )

    def reload(self, stream: Stream) -> None:
        """Re-reads a stream from disk after a failed log write (the flusher calls it, holding its lock,
        so no commit of the stream is under way); its consumers drop what is gone."""
        stream.reload(self.new_store(stream.config, stream.stream_id, stream.store.partitioner.tokens,
                                     stream_key_tokens(stream), stream_protected(stream), _stream_lease(stream)))
        with stream.lock:
            for consumer in stream.consumers.values():
                gone = [s for s in consumer.state.pending if not stream.index.is_live(s)]
                consumer.drop_removed(np.array(gone, np.int64))


def _stream_lease(stream: Stream) -> Lease | None:
    """The stream's own lease (several gateways); None when the warehouse's lease fences its log."""
    return getattr(stream.store, "fence_lease", None)
