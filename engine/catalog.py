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

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine import encryption, errors
from engine.config import StreamConfig, check_stream_config, parse_stream_config
from engine.messages import InboundMessage, PublishResult
from engine.pipeline import GroupCommit
from engine.store.erasures import pending_requests
from engine.store.layout import Layout
from engine.store.wal import SUFFIX
from engine.stream import Stream
from engine.subjects import is_valid_subject, subjects_collide

LOAD_THREADS = 4  # streams read or recovered at once at start
LOAD_PARALLEL_FROM = 16  # fewer streams are read one by one
OBJECT_STREAM_PREFIX = "OBJ_"  # engine/objects.py: its orphan sweep at start looks into every object store
T = TypeVar("T")
R = TypeVar("R")


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

    def open(self, opener: Callable[[StreamRecord], Stream]) -> Stream:
        """The stream, opened by `opener` if it is not yet: once, however many ask at the same time."""
        stream = self.stream
        if stream is None:
            with self.opening:
                if self.stream is None:
                    assert self.record is not None
                    self.attach(opener(self.record))
                stream = self.stream
        assert stream is not None
        return stream

    @property
    def config(self) -> StreamConfig:
        if self.stream is not None:
            return self.stream.config
        assert self.record is not None
        return self.record.config


def check_page(subject: str | None, offset: int, limit: int) -> None:
    """A listing's subject filter and page bounds, or a 400."""
    if subject is not None and not is_valid_subject(subject):
        raise errors.bad_request(f"invalid subject {subject!r}")
    if offset < 0 or limit <= 0:
        raise errors.bad_request("offset must be ≥ 0 and limit > 0")


def listed(entries: Mapping[str, CatalogEntry], subject: str | None) -> list[tuple[str, CatalogEntry]]:
    """The streams in name order; with `subject`, those whose subjects collide with it."""
    items = sorted(entries.items())
    if subject is None:
        return items
    return [(n, e) for n, e in items if any(subjects_collide(subject, x) for x in e.config.subjects or [])]


def check_overlap(entries: Mapping[str, CatalogEntry], config: StreamConfig, exclude: str | None = None) -> None:
    """Raises 10065 when `config`'s subjects collide with another stream's (opened or not)."""
    for name, entry in entries.items():
        if name == exclude or name == config.name:
            continue
        for a in config.subjects or []:
            for b in entry.config.subjects or []:
                if subjects_collide(a, b):
                    raise errors.subjects_overlap()


def has_log(folder: os.PathLike[str]) -> bool:
    """Whether a stream's local log folder holds a segment (records maybe not flushed yet)."""
    try:
        with os.scandir(folder) as found:
            return any(e.name.endswith(SUFFIX) for e in found)
    except FileNotFoundError:
        return False


def in_parallel(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`function` over `items`, a few at a time (each mostly waits on small objects), in their order.
    The items go to the threads in a few runs, not one by one: a task per item cost more than the
    item itself for ten thousand small configs."""
    if len(items) < LOAD_PARALLEL_FROM:
        return [function(item) for item in items]
    size = -(-len(items) // (LOAD_THREADS * 4))
    runs = [items[i : i + size] for i in range(0, len(items), size)]
    with ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="jetlake-recover") as pool:
        return [out for run in pool.map(lambda run: [function(item) for item in run], runs) for out in run]


def opened_at_start(records: list[StreamRecord], layout: Layout, act_alone: Callable[[str], bool],
                    every: bool = False) -> set[str]:
    """The names of the streams that cannot wait (the module says why each); `every`: all of them."""
    if every:
        return {r.config.name for r in records}
    erasing = {r.get("stream_id") for r in pending_requests(layout)}

    def urgent(r: StreamRecord) -> bool:
        return (r.config.storage != "file" or r.key_tokens is not None or r.stream_id in erasing
                or r.config.name.startswith(OBJECT_STREAM_PREFIX) or has_log(layout.wal_dir(r.config.name))
                or act_alone(r.config.name))

    return {r.config.name for r, flag in zip(records, in_parallel(urgent, records), strict=True) if flag}
