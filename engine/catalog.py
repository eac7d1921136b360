"""The stream catalog: every stream of an account by name, its config always, the stream itself once used.

A restart reads each stream's config record (`_system/streams/<name>.json`: config, creation time,
stream id, partitioning, encryption) from the catalog's compact copy (engine/catalog_store.py: one
object, repaired from the files of the streams changed since it was written) and opens only the
streams that cannot wait: those with an unflushed log (an acknowledged message is replayed before
anything else happens), with a consumer that acts on its own (push delivery, an inactivity
threshold), with a pending erasure, or when the account limits its bytes (every publish sums every
stream's bytes). The others stay catalog entries: publish routing, the subject-overlap check of a
create, `max_streams`, STREAM.NAMES and an account info need only their records (and the copy's
counters); the first publish, read, info, consumer call or pull opens one (its index, its log's recovery,
its consumers), once, under the entry's lock. Nothing is read from an unopened stream but its config,
so no stale state can be seen. Counterpart: nats-server opens every stream at start
(server/jetstream.go `enableJetStream` → `addStream`); this is where JetLake differs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from engine import encryption, errors
from engine.catalog_store import CatalogStore
from engine.config import StreamConfig, check_stream_config, parse_stream_config
from engine.messages import InboundMessage, PublishResult
from engine.pipeline import GroupCommit
from engine.store.erasures import pending_requests
from engine.store.layout import Layout
from engine.store.wal import SUFFIX
from engine.stream import Stream
from engine.subject_routes import SubjectRoutes
from engine.subjects import is_valid_subject

log = logging.getLogger(__name__)

LOAD_THREADS = 4  # streams read or recovered at once at start
LOAD_PARALLEL_FROM = 16  # fewer streams are read one by one
OBJECT_STREAM_PREFIX = "OBJ_"  # engine/objects.py: its orphan sweep at start looks into every object store
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class StreamRecord:
    """A stream's config record, as stored: what opening the stream needs and what the catalog serves.

    The config is kept as its checked JSON and made into a `StreamConfig` when asked (the stream's
    opening): ten thousand idle streams' models took 35 MB. What routing, the overlap and limit checks
    and the listings read of an unopened stream is kept apart (`name`, `subjects`, ...)."""

    name: str
    subjects: tuple[str, ...]
    storage: str
    max_bytes: int
    max_consumers: int
    config_json: str = field(repr=False)  # a str: orjson's bytes keep a 16 KiB buffer each
    created_ns: int
    stream_id: str
    partition_tokens: int
    key_tokens: int | None = None  # an encrypted stream's key tokens (None: plain)
    protected: bool = False  # an encrypted stream whose subjects are sealed too

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> StreamRecord:
        """A record as a stream's own file holds it: its config parsed and checked as a create's."""
        config, _ = parse_stream_config(record["config"])
        return cls.of(record, check_stream_config(config))

    @classmethod
    def from_catalog(cls, record: dict[str, Any]) -> StreamRecord:
        """A record from the catalog copy, which holds configs already checked (`to_json` of a
        `from_json`'s) behind a checksum (engine/catalog_store.py): its model is made at the stream's
        opening, not here (ten thousand models cost 0.4 s of a restart)."""
        config = record["config"]
        if not isinstance(config["name"], str) or not isinstance(config["storage"], str):
            raise TypeError("a catalog record without a name or storage")
        return cls(
            config["name"], tuple(config.get("subjects") or ()), config["storage"], int(config["max_bytes"]),
            int(config["max_consumers"]), orjson.dumps(config).decode(), record["created"], record["stream_id"],
            record["partition_tokens"], encryption.record_key_tokens(record), encryption.record_protected(record),
        )

    @classmethod
    def of(cls, record: dict[str, Any], config: StreamConfig) -> StreamRecord:
        return cls(
            config.name, tuple(config.subjects or ()), config.storage, config.max_bytes, config.max_consumers,
            orjson.dumps(config.to_json()).decode(), record["created"], record["stream_id"],
            record.get("partition_tokens", config.legacy_partition_tokens),
            encryption.record_key_tokens(record), encryption.record_protected(record),
        )

    @property
    def config(self) -> StreamConfig:
        """A new model of the config each time (the stream keeps the one it is opened with)."""
        return StreamConfig.model_validate_json(self.config_json)

    def to_json(self) -> dict[str, Any]:
        """The record as a stream's file holds it (`record_json` of the opened stream gives the same fields)."""
        return {
            "config": orjson.loads(self.config_json), "created": self.created_ns, "stream_id": self.stream_id,
            "partition_tokens": self.partition_tokens,
            **encryption.record_field(self.key_tokens, self.protected),
        }


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
    def shape(self) -> StreamConfig | StreamRecord:
        """What the limit checks read (engine/accounts/limits.py `StreamShape`): the config, or the record."""
        if self.stream is not None:
            return self.stream.config
        assert self.record is not None
        return self.record

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def subjects(self) -> Sequence[str]:
        return self.shape.subjects or ()


def check_page(subject: str | None, offset: int, limit: int) -> None:
    """A listing's subject filter and page bounds, or a 400."""
    if subject is not None and not is_valid_subject(subject):
        raise errors.bad_request(f"invalid subject {subject!r}")
    if offset < 0 or limit <= 0:
        raise errors.bad_request("offset must be ≥ 0 and limit > 0")


class StreamEntries(dict[str, CatalogEntry]):
    """Every stream of an account by name, with its subject routes kept in step: whatever adds, replaces
    or removes an entry updates them, and `rerouted` follows a config update that changed subjects."""

    def __init__(self) -> None:
        super().__init__()
        self.routes = SubjectRoutes()

    def __setitem__(self, name: str, entry: CatalogEntry) -> None:
        super().__setitem__(name, entry)
        self.routes.set(name, entry.subjects)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.routes.discard(name)

    def pop(self, name: str, *default: Any) -> Any:  # type: ignore[override]
        self.routes.discard(name)
        return super().pop(name, *default)

    def rerouted(self, name: str) -> None:
        self.routes.set(name, self[name].subjects)

    def capturing(self, subject: str) -> str | None:
        """The name of the stream capturing the literal `subject`."""
        return self.routes.match(subject)


def listed(entries: StreamEntries, subject: str | None) -> list[tuple[str, CatalogEntry]]:
    """The streams in name order; with `subject`, those whose subjects collide with it, found in one walk
    of the subject routes. The caller holds the registry's lock, so the routes and entries agree."""
    if subject is None:
        return sorted(entries.items())
    return sorted((name, entries[name]) for name in entries.routes.colliding(subject))


def check_overlap(entries: StreamEntries, config: StreamConfig, exclude: str | None = None) -> None:
    """Raises 10065 when `config`'s subjects collide with another stream's (opened or not)."""
    for subject in config.subjects or []:
        if entries.routes.colliding(subject) - {exclude, config.name}:
            raise errors.subjects_overlap()


def has_log(folder: os.PathLike[str] | str) -> bool:
    """Whether a stream's local log folder holds a segment (records maybe not flushed yet)."""
    try:
        return any(name.endswith(SUFFIX) for name in os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return False


def streams_with_log(layout: Layout, names: set[str]) -> set[str]:
    """Those of `names` whose local log folder holds a segment: one listing of the logs' folder, then
    one of each stream's (by string joins: ten thousand `Path`s cost more than the listings)."""
    root = os.fspath(layout.wal_dir_root / "_wal")
    try:
        folders = os.listdir(root)
    except FileNotFoundError:
        return set()
    return {name for name in folders if name in names and has_log(f"{root}/{name}")}


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
        return {r.name for r in records}
    erasing = {r.get("stream_id") for r in pending_requests(layout)}
    logged = streams_with_log(layout, {r.name for r in records})

    def urgent(r: StreamRecord) -> bool:
        return (r.storage != "file" or r.key_tokens is not None or r.stream_id in erasing
                or r.name.startswith(OBJECT_STREAM_PREFIX) or r.name in logged or act_alone(r.name))

    return {r.name for r in records if urgent(r)}


@dataclass
class CatalogRead:
    """What a start takes from the catalog: records in name order, consumer names (with whether each
    acts unasked) by stream, the copy's counters by stream, and whether the copy must be rewritten."""

    records: list[StreamRecord]
    consumers: dict[str, dict[str, bool]]
    counters: dict[str, dict[str, int]]
    rewrite: bool


def read_catalog(store: CatalogStore) -> CatalogRead:
    """The copy and the files of the streams marked since it was written, or every file when there is
    no intact copy (engine/catalog_store.py)."""
    loaded = store.load()
    records: dict[str, StreamRecord] = {}
    if loaded is not None:
        items, marked = loaded
        try:
            records = {name: StreamRecord.from_catalog(item.record) for name, item in items.items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("the catalog copy does not parse (%s): every stream's files are read", exc)
            loaded = None
    if loaded is None:
        items, marked = store.scan(in_parallel), []
        records = {name: StreamRecord.from_json(item.record) for name, item in items.items()}
    for name in marked:
        item = store.read_stream(name)
        if item is None:
            items.pop(name, None)
            records.pop(name, None)
            continue
        item.state = items[name].state if name in items else None  # still checked before use
        records[name], items[name] = StreamRecord.from_json(item.record), item
    return CatalogRead(
        [records[name] for name in sorted(records)],
        {name: item.consumers for name, item in items.items()},
        {name: item.state for name, item in items.items() if item.state is not None},
        loaded is None or bool(marked),
    )


def record_json(stream: Stream) -> dict[str, Any]:
    """An opened stream's config record as its file holds it (`StreamRecord.to_json` gives the same fields)."""
    return {
        "config": stream.config.to_json(), "created": stream.created_ns, "stream_id": stream.stream_id,
        "partition_tokens": stream.store.partitioner.tokens,
        **encryption.record_field(stream_key_tokens(stream), stream_protected(stream)),
    }


def stream_key_tokens(stream: Stream) -> int | None:
    """The key tokens of an encrypted stream; None for a plain one."""
    sealer = getattr(stream.store, "sealer", None)
    return None if sealer is None else sealer.keys.key_tokens


def stream_protected(stream: Stream) -> bool:
    """Whether an encrypted stream's subjects are protected (sealed, keyed-hash partitions)."""
    sealer = getattr(stream.store, "sealer", None)
    return sealer is not None and sealer.protected
