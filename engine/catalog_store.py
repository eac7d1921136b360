"""The stream catalog's compact copy: one object per account, so a restart reads one object, not a
config per stream and per consumer.

The per-stream files stay the truth (`_system/streams/<name>.json`, `_system/consumers/<stream>/*`);
this copy is a cache of what a start needs from them: each stream's config record, its consumers'
names and whether one acts unasked (engine/catalog.py), and the few counters an account info sums.

    object  = magic "JLC1" | 16-byte xxh3-128 of the payload | payload (zstd of JSON)
    JSON    = {"streams": {name: {"record": {...}, "consumers": {name: acts_alone}, "state": {...}}}}

It is made consistent with the truth by intent marks: every change of a stream's files (create,
update, delete of the stream or of one of its consumers) first writes a mark naming the stream
(`_system/catalog/dirty/<stream>`, fsynced), then the files. A start reads the copy and, for each
stream marked, that stream's own files again; a crash anywhere between a mark and the copy's next
rewrite is therefore repaired. A copy that is missing or damaged means reading every file (the
listing of old). Rewriting the copy folds the marks in: a mark is removed only once the copy holds
what its stream's files said after every change that began before the rewrite began.
Counterpart: nats-server keeps no such copy (each stream's `meta.inf` is read at start).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import xxhash

from engine.store.layout import Layout, file_name
from engine.store.objectstore import ObjectNotFoundError

log = logging.getLogger(__name__)

MAGIC = b"JLC1"
_HEAD = struct.Struct("<4s16s")
_RAW_LEN = struct.Struct("<Q")
_ZSTD_LEVEL = 3
REWRITE_AFTER = 512  # marks gathered before the copy is rewritten in the background


@dataclass
class CatalogItem:
    """What the copy holds of one stream: its config record as stored, its consumers' names with
    whether each acts unasked, and its counters with the table and log position they are true at."""

    record: dict[str, Any]
    consumers: dict[str, bool] = field(default_factory=dict)
    state: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"record": self.record, "consumers": self.consumers}
        if self.state is not None:
            out["state"] = self.state
        return out


def acts_alone(record: dict[str, Any]) -> bool:
    """Whether a consumer record (as stored) acts unasked: push delivery, ephemeral, an inactivity threshold."""
    config = record.get("config") or {}
    return bool(record.get("ephemeral") or config.get("deliver_subject") or config.get("inactive_threshold"))


def encode(items: dict[str, CatalogItem]) -> bytes:
    body = orjson.dumps({"streams": {name: item.to_json() for name, item in items.items()}})
    payload = _RAW_LEN.pack(len(body)) + pa.Codec("zstd", _ZSTD_LEVEL).compress(body, asbytes=True)
    return _HEAD.pack(MAGIC, xxhash.xxh3_128_digest(payload)) + payload


def decode(data: bytes) -> dict[str, CatalogItem]:
    """The copy's items; raises ValueError when it is not a whole, intact copy of this format."""
    if len(data) < _HEAD.size + _RAW_LEN.size:
        raise ValueError("catalog copy too short")
    magic, digest = _HEAD.unpack_from(data, 0)
    payload = memoryview(data)[_HEAD.size :]
    if magic != MAGIC or xxhash.xxh3_128_digest(payload) != digest:
        raise ValueError("catalog copy damaged (magic or checksum)")
    (length,) = _RAW_LEN.unpack_from(payload, 0)
    body = pa.Codec("zstd").decompress(payload[_RAW_LEN.size :], length, asbytes=True)
    streams = orjson.loads(body)["streams"]
    return {name: CatalogItem(s["record"], s["consumers"], s.get("state")) for name, s in streams.items()}


class CatalogStore:
    """The account's catalog copy and its intent marks (see the module docstring)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.key = layout.key("_system", "catalog", "streams.jlc")
        self.marks_key = layout.key("_system", "catalog", "dirty")
        self._lock = threading.Lock()
        self._marked: dict[str, int] = {}  # stream -> the number of the last change that began on it
        self._busy: dict[str, int] = {}  # stream -> changes under way
        self._changes = 0
        self._rewriting = False
        self.on_marks: Callable[[], None] | None = None  # called once REWRITE_AFTER streams are marked

    # -- changes ----------------------------------------------------------------------------------

    @contextmanager
    def changing(self, stream: str) -> Iterator[None]:
        """Wraps a change of a stream's files: its mark is durable before the body writes anything."""
        with self._lock:
            self._changes += 1
            if stream not in self._marked:
                self.layout.objects.put(self._mark_key(stream), stream.encode())
            self._marked[stream] = self._changes
            self._busy[stream] = self._busy.get(stream, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._busy[stream] -= 1
                if not self._busy[stream]:
                    del self._busy[stream]
                many = len(self._marked) >= REWRITE_AFTER and not self._rewriting
            if many and self.on_marks is not None:
                self.on_marks()

    @property
    def marked(self) -> int:
        return len(self._marked)

    def _mark_key(self, stream: str) -> str:
        return f"{self.marks_key}/{file_name(stream, '')}"

    # -- reading ----------------------------------------------------------------------------------

    def load(self) -> tuple[dict[str, CatalogItem], list[str]] | None:
        """The copy's items and the streams marked since it was written; None without an intact copy
        (every file is read then: the marks found are folded in by the next rewrite all the same)."""
        marks = self._marks()
        try:
            items = decode(self.layout.objects.get(self.key).data)
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            log.warning("the catalog copy is damaged (%s): every stream's files are read", exc)
            return None
        return items, marks

    def _marks(self) -> list[str]:
        names = []
        for meta in self.layout.objects.list(self.marks_key):
            try:
                names.append(self.layout.objects.get(meta.key).data.decode())
            except ObjectNotFoundError:
                continue
        with self._lock:
            for name in names:
                self._marked.setdefault(name, 0)
        return names

    def read_stream(self, stream: str) -> CatalogItem | None:
        """One stream's item from its own files (the truth); None when its config is gone."""
        try:
            record = orjson.loads(self.layout.objects.get(self.layout.stream_config_key(stream)).data)
        except ObjectNotFoundError:
            return None
        consumers = {}
        for meta in self.layout.objects.list(self.layout.consumer_configs_key(stream)):
            if meta.key.endswith(".json"):
                try:
                    found = orjson.loads(self.layout.objects.get(meta.key).data)
                except ObjectNotFoundError:
                    continue
                consumers[found["name"]] = acts_alone(found)
        return CatalogItem(record, consumers)

    def scan(self, in_parallel: Callable[[Callable[[str], Any], list[str]], list[Any]]) -> dict[str, CatalogItem]:
        """Every stream's item from the files (a copy missing or damaged): one listing of the stream
        configs and one of the consumer configs, then every file read."""
        objects, folder = self.layout.objects, self.layout.stream_configs_key + "/"
        keys = [m.key for m in objects.list(self.layout.stream_configs_key)
                if m.key.endswith(".json") and "/" not in m.key[len(folder):]]
        records = in_parallel(lambda key: orjson.loads(objects.get(key).data), keys)
        consumer_keys: dict[str, list[str]] = {}
        for meta in objects.list(self.layout.consumer_configs_root_key):
            parent, _, name = meta.key.rpartition("/")
            if name.endswith(".json"):
                consumer_keys.setdefault(parent, []).append(meta.key)
        items: dict[str, CatalogItem] = {}
        for record, consumers in zip(records, in_parallel(
                lambda r: [orjson.loads(objects.get(k).data) for k in
                           consumer_keys.get(self.layout.consumer_configs_key(r["config"]["name"]), [])], records),
                strict=True):
            items[record["config"]["name"]] = CatalogItem(record, {c["name"]: acts_alone(c) for c in consumers})
        return items

    # -- rewriting --------------------------------------------------------------------------------

    def rewrite(self, build: Callable[[set[str]], dict[str, CatalogItem]]) -> bool:
        """Writes the copy `build(marked)` returns (it reads the marked streams' files again, and takes
        every other stream from what it holds), then removes the marks it covers: those of streams with
        no change under way when it began and none begun since. False if another rewrite is under way."""
        with self._lock:
            if self._rewriting:
                return False
            self._rewriting = True
            began, busy, marked = self._changes, set(self._busy), set(self._marked)
        try:
            self.layout.objects.put(self.key, encode(build(marked)))
            with self._lock:
                done = [n for n in marked if n not in busy and self._marked.get(n, began + 1) <= began]
                if len(done) == len(self._marked):  # every mark: the folder goes whole, not a fsync each
                    self.layout.objects.delete_prefix(self.marks_key)
                else:
                    for name in done:
                        self.layout.objects.delete(self._mark_key(name))
                for name in done:
                    del self._marked[name]
            return True
        finally:
            with self._lock:
                self._rewriting = False
