"""The stream catalog: every stream of an account by name, its config always, the stream itself once used.

A restart reads each stream's config record (`_system/streams/<name>.json`: config, creation time,
stream id, partitioning, encryption) and opens only the streams that cannot wait: those with an
unflushed log (an acknowledged message is replayed before anything else happens), with a consumer that
acts on its own (push delivery, an inactivity threshold), with a pending erasure, or when the account
limits its bytes (every publish sums every stream's bytes). The others stay catalog entries: publish
routing, the subject-overlap check of a create, `max_streams`, and STREAM.NAMES need only their
configs; the first publish, read, info, consumer call or pull opens one (its index, its log's recovery,
its consumers), once, under the entry's lock. Nothing is read from an unopened stream but its config,
so no stale state can be seen. Counterpart: nats-server opens every stream at start
(server/jetstream.go `enableJetStream` → `addStream`); this is where JetLake differs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from engine import encryption
from engine.config import StreamConfig, check_stream_config, parse_stream_config
from engine.messages import InboundMessage, PublishResult
from engine.pipeline import GroupCommit
from engine.stream import Stream


@dataclass(frozen=True)
class StreamRecord:
    """A stream's config record, as stored: what opening the stream needs and what the catalog serves."""

    config: StreamConfig
    created_ns: int
    stream_id: str
    partition_tokens: int
    key_tokens: int | None = None  # an encrypted stream's key tokens (None: plain)
    protected: bool = False  # an encrypted stream whose subjects are sealed too

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> StreamRecord:
        config, _ = parse_stream_config(record["config"])
        config = check_stream_config(config)
        return cls(
            config, record["created"], record["stream_id"],
            record.get("partition_tokens", config.legacy_partition_tokens),
            encryption.record_key_tokens(record), encryption.record_protected(record),
        )


@dataclass
class CatalogEntry:
    """One stream of the catalog; `stream` is None until it is opened."""

    record: StreamRecord | None
    stream: Stream | None = None
    commit: GroupCommit[InboundMessage, PublishResult] | None = None
    opening: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, stream: Stream) -> CatalogEntry:
        entry = cls(None)
        entry.attach(stream)
        return entry

    def attach(self, stream: Stream) -> None:
        """The stream is open: it serves from now on (its config is the stream's own from here)."""
        self.commit = GroupCommit(stream.process)
        self.stream = stream
        self.record = None

    @property
    def config(self) -> StreamConfig:
        if self.stream is not None:
            return self.stream.config
        assert self.record is not None
        return self.record.config
