"""Object stores: JetStream's object store (ADR-20) as a view over an ordinary stream `OBJ_<bucket>`.

An object is its chunks, published to `$O.<bucket>.C.<nuid>` with a new nuid for every put, and its
info, published last to `$O.<bucket>.M.<base64url(name)>` with `Nats-Rollup: sub`. Readers find an
object through its info only, so a put that fails midway is invisible; its chunks are purged at once
(tombstones for the jobs), and chunks no info refers to — a put cut short by a crash — are purged
when the engine opens. Replacing an object publishes the new info on the condition that the info it
read is still the latest, then purges the old chunks: a reader sees the old object or the new one.
The table is partitioned by the first three subject tokens (chunks apart from infos), not by object.
Counterpart: nats.go object.go.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pybase64
from pydantic import Field

from engine import errors
from engine import headers as hdr
from engine.config import PARTITION_TOKENS_KEY, Storage, _Model, parse_model
from engine.errors import ErrorCode, JetStreamError
from engine.info import rfc3339
from engine.buckets import Buckets, check_bucket
from engine.store.base import StoredMessage
from engine.messages import InboundMessage, PubAck
from engine.stream import Stream
from engine.watch import Initial, SubjectWatch

log = logging.getLogger(__name__)

STREAM_PREFIX = "OBJ_"
DEFAULT_CHUNK_SIZE = 128 * 1024
PARTITION_TOKENS = 3  # `$O.<bucket>.C` and `$O.<bucket>.M`: chunks apart from infos, not one folder per object
READ_BATCH_BYTES = 8 * 1024 * 1024
# A put commits its stream's log itself once this many bytes wait, and waits for that commit: with the
# flusher alone, 2 x flush_bytes more pile up while it writes (1.8 GB of RSS for a 1 GiB put).
FLUSH_AT_BYTES = 16 * 1024 * 1024
MAX_NAME_BYTES = 255
_NUID_ALPHABET = string.ascii_letters + string.digits


class ObjectStoreConfig(_Model):
    """A bucket's configuration, under nats.go's JSON names (`ObjectStoreConfig`)."""

    bucket: str
    description: str | None = None
    ttl: int = Field(0, description="nanoseconds; 0 keeps objects forever")
    max_bytes: int = -1
    storage: Storage = "file"
    replicas: int = 1
    compression: bool = False
    metadata: dict[str, str] | None = None


@dataclass
class ObjectInfo:
    """nats.go's ObjectInfo; `mtime` is the time its info message was stored, as in JetStream."""

    name: str
    bucket: str
    nuid: str
    size: int = 0
    chunks: int = 0
    digest: str = ""
    deleted: bool = False
    description: str | None = None
    max_chunk_size: int = 0
    metadata: dict[str, str] | None = None
    mtime: int = 0
    seq: int = field(default=0, compare=False)

    def stored(self) -> bytes:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.metadata:
            out["metadata"] = self.metadata
        if self.max_chunk_size:
            out["options"] = {"max_chunk_size": self.max_chunk_size}
        out.update(bucket=self.bucket, nuid=self.nuid, size=self.size, chunks=self.chunks, digest=self.digest)
        if self.deleted:
            out["deleted"] = True
        return orjson.dumps(out)

    def to_json(self) -> dict[str, Any]:
        out = orjson.loads(self.stored())
        out["mtime"] = rfc3339(self.mtime)
        out["deleted"] = self.deleted
        return out  # type: ignore[no-any-return]

    @classmethod
    def from_message(cls, msg: StoredMessage) -> ObjectInfo:
        raw = orjson.loads(msg.data)
        return cls(
            name=raw["name"],
            bucket=raw["bucket"],
            nuid=raw.get("nuid", ""),
            size=raw.get("size", 0),
            chunks=raw.get("chunks", 0),
            digest=raw.get("digest", ""),
            deleted=raw.get("deleted", False),
            description=raw.get("description"),
            max_chunk_size=(raw.get("options") or {}).get("max_chunk_size", 0),
            metadata=raw.get("metadata"),
            mtime=msg.ts,
            seq=msg.seq,
        )


def stream_name(bucket: str) -> str:
    return STREAM_PREFIX + bucket


def chunk_subject(bucket: str, nuid: str) -> str:
    return f"$O.{bucket}.C.{nuid}"


def meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{pybase64.urlsafe_b64encode(name.encode()).decode()}"


def digest_of(sha: Any) -> str:
    return "SHA-256=" + pybase64.urlsafe_b64encode(sha.digest()).decode()


def new_nuid() -> str:
    return "".join(secrets.choice(_NUID_ALPHABET) for _ in range(22))


def check_name(name: str) -> None:
    if not name or len(name.encode()) > MAX_NAME_BYTES or any(ord(c) < 0x20 for c in name):
        raise errors.bad_request(f"invalid object name: 1 to {MAX_NAME_BYTES} bytes, no control characters")


def object_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.NO_MESSAGE_FOUND, "object not found")


def damaged(name: str, detail: str) -> JetStreamError:
    return JetStreamError(500, ErrorCode.GENERAL, f"object {name!r} is damaged: {detail}")


def stream_config(config: ObjectStoreConfig) -> dict[str, Any]:
    """The backing stream's config, as nats.go's CreateObjectStore builds it."""
    body: dict[str, Any] = {
        "name": stream_name(config.bucket),
        "subjects": [f"$O.{config.bucket}.C.>", f"$O.{config.bucket}.M.>"],
        "max_age": config.ttl,
        "max_bytes": config.max_bytes,
        "storage": config.storage,
        "num_replicas": config.replicas,
        "discard": "new",
        "allow_rollup_hdrs": True,
        "allow_direct": True,
        "compression": "s2" if config.compression else "none",
        "metadata": {**(config.metadata or {}), PARTITION_TOKENS_KEY: str(PARTITION_TOKENS)},
    }
    if config.description is not None:
        body["description"] = config.description
    return body


def parse_config(body: Any) -> ObjectStoreConfig:
    config = parse_model(ObjectStoreConfig, body, "object store configuration")
    check_bucket(config.bucket)
    if config.ttl < 0:
        raise errors.invalid_config("ttl can not be negative")
    if config.max_bytes == 0:
        config.max_bytes = -1
    if config.replicas == 0:
        config.replicas = 1
    return config


class ObjectWriter:
    """One put: chunks published as the bytes arrive, hashed on the way; the info last.

    Call `write` with the body as it comes, then `finish`; on any failure call `abort`, which purges
    the chunks written so far. Nothing is visible to readers before `finish` publishes the info.
    """

    def __init__(self, stores: ObjectStores, bucket: str, name: str, chunk_size: int, description: str | None = None) -> None:
        check_name(name)
        self.stores = stores
        self.stream = stores.stream(bucket)
        if self.stream.config.sealed:
            raise errors.sealed()
        self.info = ObjectInfo(name, bucket, new_nuid(), max_chunk_size=chunk_size, description=description)
        self.subject = chunk_subject(bucket, self.info.nuid)
        self.chunk_size = chunk_size
        self._sha = hashlib.sha256()
        self._pending = bytearray()
        self._flush_at = FLUSH_AT_BYTES

    def write(self, data: bytes) -> None:
        """Publishes every whole chunk the bytes so far make, as one group commit."""
        self._sha.update(data)
        self._pending += data
        whole = len(self._pending) - len(self._pending) % self.chunk_size
        if whole:
            self._publish(self._pending[:whole])
            del self._pending[:whole]

    def finish(self, expected_digest: str | None = None) -> ObjectInfo:
        """Publishes the last chunk and the info, then purges the chunks of the object it replaced."""
        if self._pending:
            self._publish(self._pending)
            self._pending.clear()
        self.info.digest = digest_of(self._sha)
        if expected_digest is not None and expected_digest != self.info.digest:
            raise errors.bad_request(f"digest mismatch: the body's is {self.info.digest}, the request said {expected_digest}")
        return self.stores.publish_info(self.info)

    def abort(self) -> None:
        try:
            self.stores.purge_chunks(self.stream, self.subject)
        except JetStreamError as exc:  # a sealed or deleted bucket: nothing more can be written or purged
            log.warning("purging the chunks of an aborted put of %s failed: %s", self.info.name, exc)

    def _flush_if_due(self) -> None:
        """Commits the log once FLUSH_AT_BYTES wait; if that makes no progress (a Spark job holds the
        table's lease), tries again only after as many more bytes, leaving the rest to `throttle`."""
        pending = self.stream.store.pending_bytes()
        if pending < self._flush_at:
            return
        self.stores.js.flush_stream(self.stream)
        progress = self.stream.store.pending_bytes() < pending
        self._flush_at = FLUSH_AT_BYTES if progress else pending + FLUSH_AT_BYTES

    def _publish(self, data: bytearray) -> None:
        self._flush_if_due()
        self.stores.js.throttle(self.stream)
        view = memoryview(data)
        messages = [
            InboundMessage(self.subject, bytes(view[i : i + self.chunk_size]))
            for i in range(0, len(view), self.chunk_size)
        ]
        for result in self.stores.js.publish(messages):
            if isinstance(result, JetStreamError):
                raise result
        self.info.chunks += len(messages)
        self.info.size += len(data)


class ObjectStores(Buckets):
    """Every object-store bucket of an engine."""

    prefix = STREAM_PREFIX

    # -- buckets ------------------------------------------------------------------------------

    def create(self, body: Any) -> tuple[dict[str, Any], bool]:
        """Creates a bucket; returns its status and whether it was created (False: identical exists)."""
        config = parse_config(body)
        return self._create(config.bucket, stream_config(config))

    def status(self, bucket: str) -> dict[str, Any]:
        stream = self.stream(bucket)
        c = stream.config
        out: dict[str, Any] = {
            "bucket": bucket,
            "ttl": c.max_age,
            "storage": c.storage,
            "replicas": c.num_replicas,
            "sealed": c.sealed,
            "size": stream.state()["bytes"],
            "max_bytes": c.max_bytes,
            "backing_store": "JetStream",
            "is_compressed": c.compression == "s2",
            "stream": c.name,
        }
        if c.description is not None:
            out["description"] = c.description
        return out

    def seal(self, bucket: str) -> dict[str, Any]:
        """Seals the stream, as nats.go's Seal; a sealed stream allows no rollups, deletes or purges."""
        stream = self.stream(bucket)
        body = stream.config.to_json()
        body.update(sealed=True, allow_rollup_hdrs=False)
        self.js.update_stream(stream.name, body)
        return self.status(bucket)

    # -- objects ------------------------------------------------------------------------------

    def writer(self, bucket: str, name: str, chunk_size: int = DEFAULT_CHUNK_SIZE, description: str | None = None) -> ObjectWriter:
        limit = self.js.options.max_payload
        if not 1 <= chunk_size <= limit:
            raise errors.bad_request(f"chunk_size must be from 1 to {limit} bytes")
        return ObjectWriter(self, bucket, name, chunk_size, description)

    def put(self, bucket: str, name: str, data: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> ObjectInfo:
        """A whole object at once (the streamed route uses `writer`)."""
        writer = self.writer(bucket, name, chunk_size)
        try:
            writer.write(data)
            return writer.finish()
        except BaseException:
            writer.abort()
            raise

    def publish_info(self, info: ObjectInfo) -> ObjectInfo:
        """Publishes `info` over the latest info of its name, then purges the replaced object's chunks.

        The publish expects the info it read to be the latest, so of two concurrent puts of one name
        each purges exactly the chunks it replaced.
        """
        stream = self.stream(info.bucket)
        subject = meta_subject(info.bucket, info.name)
        for _ in range(100):
            previous = self._latest(stream, subject)
            headers = {hdr.ROLLUP: [hdr.ROLLUP_SUBJECT], hdr.EXPECTED_LAST_SUBJECT_SEQ: [str(previous.seq if previous else 0)]}
            result = self.js.publish([InboundMessage(subject, info.stored(), headers)])[0]
            if isinstance(result, errors.WrongLastSequenceError):
                continue
            if isinstance(result, JetStreamError):
                raise result
            assert isinstance(result, PubAck)
            if previous is not None and (previous.nuid != info.nuid or info.deleted):
                self.purge_chunks(stream, chunk_subject(info.bucket, previous.nuid))
            return self.info_at(stream, result.seq)
        raise errors.UnavailableError(f"object {info.name!r} is being replaced too often to publish its info")

    def info(self, bucket: str, name: str, *, include_deleted: bool = False) -> ObjectInfo:
        check_name(name)
        info = self._latest(self.stream(bucket), meta_subject(bucket, name))
        if info is None or (info.deleted and not include_deleted):
            raise object_not_found()
        return info

    def info_at(self, stream: Stream, seq: int) -> ObjectInfo:
        return ObjectInfo.from_message(stream.get(seq))

    def _latest(self, stream: Stream, subject: str) -> ObjectInfo | None:
        try:
            return ObjectInfo.from_message(stream.last_by_subject(subject))
        except errors.NoMessageFoundError:
            return None

    def delete(self, bucket: str, name: str) -> ObjectInfo:
        """Marks the object deleted (its info stays, as in JetStream) and purges its chunks."""
        info = self.info(bucket, name, include_deleted=True)
        if info.deleted:
            return info
        stream = self.stream(bucket)
        if stream.config.sealed:
            raise errors.sealed()
        marker = ObjectInfo(info.name, bucket, info.nuid, deleted=True, description=info.description, metadata=info.metadata)
        return self.publish_info(marker)

    def purge_chunks(self, stream: Stream, subject: str) -> int:
        return stream.purge(subject)

    def chunk_seqs(self, info: ObjectInfo) -> list[int]:
        """The sequences of the object's chunks, checked against its info: a missing chunk fails loudly."""
        seqs = self.stream(info.bucket).live_seqs(chunk_subject(info.bucket, info.nuid)).tolist()
        if len(seqs) != info.chunks:
            raise damaged(info.name, f"{len(seqs)} of {info.chunks} chunks present")
        return seqs  # type: ignore[no-any-return]

    def read_batches(self, info: ObjectInfo, seqs: list[int]) -> Iterator[list[bytes]]:
        """The chunks in order, a few MiB per batch; raises if one disappears meanwhile."""
        stream = self.stream(info.bucket)
        per_batch = max(1, READ_BATCH_BYTES // max(info.max_chunk_size or DEFAULT_CHUNK_SIZE, 1))
        for i in range(0, len(seqs), per_batch):
            wanted = seqs[i : i + per_batch]
            found = stream.load_many(wanted)
            if len(found) != len(wanted):
                raise damaged(info.name, "a chunk disappeared while it was read (the object was replaced or deleted)")
            yield [msg.data for msg in found]

    def list_objects(self, bucket: str, include_deleted: bool = False) -> list[ObjectInfo]:
        stream = self.stream(bucket)
        infos = [ObjectInfo.from_message(m) for m in stream.load_many(stream.last_seqs(f"$O.{bucket}.M.>"))]
        return [i for i in infos if include_deleted or not i.deleted]

    def watch(self, bucket: str, include_history: bool = False, ignore_deletes: bool = False, updates_only: bool = False) -> ObjectWatch:
        if include_history and updates_only:
            raise errors.bad_request("include_history and updates_only are mutually exclusive")
        mode: Initial = "all" if include_history else "new" if updates_only else "last_per_subject"
        return ObjectWatch(SubjectWatch(self.stream(bucket), f"$O.{bucket}.M.>", mode), ignore_deletes)

    # -- recovery -----------------------------------------------------------------------------

    def sweep_orphans(self) -> int:
        """Purges chunks that no info refers to: puts a crash cut short. Runs when the engine opens."""
        purged = 0
        for stream in self.js.streams():
            if not stream.name.startswith(STREAM_PREFIX) or stream.config.sealed:
                continue
            bucket = stream.name[len(STREAM_PREFIX) :]
            referenced = {chunk_subject(bucket, i.nuid) for i in self.list_objects(bucket) if i.chunks}
            with stream.lock:
                present = set(stream.index.subjects_state(f"$O.{bucket}.C.>"))
            for subject in sorted(present - referenced):
                purged += self.purge_chunks(stream, subject)
        if purged:
            log.info("purged %d orphaned object chunks of interrupted puts", purged)
        return purged


class ObjectWatch:
    """ObjectInfos of a bucket as they change (nats.go `Watch`); `ignore_deletes` hides deleted ones."""

    def __init__(self, watch: SubjectWatch, ignore_deletes: bool) -> None:
        self._watch = watch
        self.ignore_deletes = ignore_deletes

    @property
    def closed(self) -> bool:
        return self._watch.closed

    @property
    def stream_name(self) -> str:
        return self._watch.stream.name

    @property
    def behind(self) -> bool:
        return self._watch.behind

    def initial(self) -> list[ObjectInfo]:
        return self._visible(self._watch.initial())

    def updates(self, limit: int = 1000) -> list[ObjectInfo]:
        return self._visible(self._watch.updates(limit))

    def _visible(self, messages: list[StoredMessage]) -> list[ObjectInfo]:
        infos = [ObjectInfo.from_message(m) for m in messages]
        return [i for i in infos if not (self.ignore_deletes and i.deleted)]
