"""GDPR erasure requests: resolve what to erase, make it unreadable at once, queue it for the erase job.

`POST /v1/erasures` names one sequence, every stored message whose subject matches a filter, a KV key
(`$KV.<bucket>.<key>`: every revision) or an object (every info `$O.<bucket>.M.<name>` ever stored
and the chunks `$O.<bucket>.C.<nuid>` of every nuid those infos name). A filter resolves against
what is STORED, not only what is live: the table's rows, including those deleted with `no_erase`,
purged, removed by limits (KV history past its limit), by interest or work-queue retention and not
yet rewritten by the retention job; the unflushed buffer and log, removed messages included; and the
live index. The table is scanned outside the stream's lock (`engine/store/stored.py`); under the lock
what was flushed since the scan, the buffer and the index are added, so nothing acknowledged in
between escapes.

Then, under the stream's lock, the registry writes the request durably (sequence ranges only: no
subject, no filter text; format in engine/store/erasures.py), removes the live ones from every read
through `Stream.erase_seqs` (tombstones with reason "erase" and erase=True), and drops every
in-memory copy (`Stream.forget_erased`: the buffer, the decoded row groups, the duplicate window).
The request is written before the removal: a crash in between leaves a request for messages still
readable, which the job erases anyway, never erased messages that no request will ever remove
physically. `DELETE .../messages/{seq}` without `no_erase` queues a request the same way.

GDPR wins over a stream's `deny_delete` and `sealed` for `POST /v1/erasures`; the plain delete route
keeps JetStream's checks. A `seq` that is no longer live but not past the end is still accepted: its
row may be in the table until a job removes it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson

from engine import encryption, errors
from engine.buckets import Buckets
from engine.errors import ErrorCode, JetStreamError
from engine.info import rfc3339
from engine.kv import check_key
from engine.objects import check_name, chunk_subject, meta_subject
from engine.seq_ranges import seq_ranges
from engine.store import erasures as fmt
from engine.store import stored
from engine.store.delta import DeltaStore
from engine.store.layout import Layout
from engine.stream import Stream
from engine.subjects import FWC, PWC, is_literal, is_valid_subject, subject_matches


def erasure_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.BAD_REQUEST, "erasure request not found")


class _Subjects:
    """Subject filters as predicates on a subject and on a partition value (a subject's first tokens)."""

    def __init__(self, filters: Iterable[str], partition_tokens: int,
                 keyed_values: Callable[[str], set[str] | None] | None = None) -> None:
        self.literals: set[str] = set()
        self.wildcards: list[str] = []
        self.tokens = partition_tokens
        self.keyed_values = keyed_values  # protected subjects: the Partitioner's `values_for`
        self.add(filters)

    def add(self, filters: Iterable[str]) -> None:
        for f in filters:
            (self.literals.add(f) if is_literal(f) else self.wildcards.append(f))

    def __call__(self, subject: str) -> bool:
        return subject in self.literals or any(subject_matches(f, subject) for f in self.wildcards)

    def partition(self, partition: str | None) -> bool:
        """Whether a file of this partition may hold a matching subject (hashed values: always)."""
        if partition is None:
            return True
        if self.keyed_values is not None:
            return self._keyed_partition(partition)
        if "~" in partition:
            return True
        return any(_partition_may_hold(f, partition, self.tokens) for f in (*self.literals, *self.wildcards))


    def _keyed_partition(self, partition: str) -> bool:
        """A protected stream's partition values are keyed hashes: a filter whose partition tokens are
        literal names its values (`Partitioner.values_for`), any other may match every partition."""
        assert self.keyed_values is not None
        for f in (*self.literals, *self.wildcards):
            values = self.keyed_values(f)
            if values is None or partition in values:
                return True
        return False


def _partition_may_hold(filter_: str, partition: str, tokens: int) -> bool:
    part = partition.split(".")
    if tokens == 0 or len(part) < tokens:  # the partition is a whole subject
        return subject_matches(filter_, partition)
    wanted = filter_.split(".")
    for i, token in enumerate(part):  # the partition is the first `tokens` tokens of longer subjects too
        if i >= len(wanted):
            return False
        if wanted[i] == FWC:
            return True
        if wanted[i] not in (PWC, token):
            return False
    return True


class ErasureRegistry:
    """The erasure requests of one account's warehouse."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def erase(self, stream: Stream, seq: int | None = None, filter_: str | None = None) -> dict[str, Any]:
        """Queues an erasure of one sequence or of every stored message matching `filter_`; they leave
        every read before this returns. Returns `{"id", "status", "messages"}`."""
        if (seq is None) == (filter_ is None):
            raise errors.bad_request("give one of seq or filter")
        if filter_ is not None:
            if not is_valid_subject(filter_):
                raise errors.bad_request("invalid subject filter")
            return self._erase_subjects(stream, [filter_], None, "filter")
        assert seq is not None
        if seq <= 0:
            raise errors.bad_request("a message sequence must be a positive integer")
        with stream.lock:
            if stream.deleted:
                raise errors.StreamNotFoundError()
            stream.expire_now()
            if seq > stream.index.last_seq:
                raise errors.sequence_not_found(seq)
            return self._queue_and_remove(stream, np.array([seq], np.int64), "seq")

    def erase_key(self, kv: Buckets, bucket: str, key: str) -> dict[str, Any]:
        """Every stored revision of a KV key (`$KV.<bucket>.<key>`), deletes and purges included."""
        check_key(key)
        return self._erase_subjects(kv.stream(bucket), [f"$KV.{bucket}.{key}"], None, "key")

    def erase_object(self, objects: Buckets, bucket: str, name: str) -> dict[str, Any]:
        """Every stored info of an object name and every chunk of every nuid one of them names."""
        check_name(name)
        return self._erase_subjects(objects.stream(bucket), [meta_subject(bucket, name)], bucket, "object")

    def delete_and_queue(self, stream: Stream, seq: int) -> None:
        """`DELETE .../messages/{seq}` with erasure: JetStream's delete checks, then a queued request."""
        with stream.lock:
            record = self._queue(stream, np.array([seq], np.int64), "delete")
            try:
                stream.delete_message(seq, erase=True)
            except BaseException:
                fmt.remove_request(self.layout, record["id"])
                raise
            stream.forget_erased(np.array([seq], np.int64))

    def forget_pending(self, streams: Iterable[Stream]) -> int:
        """After a restart: what the streams rebuilt in memory from their tables and logs (the duplicate
        window, replayed messages in the buffer) forgets the messages of pending requests again.
        Returns how many requests applied."""
        by_id = {s.stream_id: s for s in streams}
        applied = 0
        for record in fmt.pending_requests(self.layout):
            stream = by_id.get(record["stream_id"])
            if stream is None or not record["ranges"]:
                continue
            seqs = np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in record["ranges"]])
            with stream.lock:
                stream.forget_erased(seqs)
            applied += 1
        return applied

    # -- resolution ---------------------------------------------------------------------------

    def _erase_subjects(self, stream: Stream, filters: list[str], object_bucket: str | None, by: str) -> dict[str, Any]:
        """Resolves `filters` against everything stored, then queues and removes, as the module says.

        With `object_bucket`, the filters are an object's info subject: the chunks of every nuid its
        stored infos name are added."""
        table = stream.store if isinstance(stream.store, DeltaStore) else None
        tokens = table.partitioner.tokens if table is not None else 0  # a legacy table keeps whole subjects
        keyed = table.partitioner.values_for if table is not None and table.partitioner.keyed is not None else None
        subjects = _Subjects(filters, tokens, keyed)
        infos = _Subjects(filters, tokens, keyed) if object_bucket is not None else None
        seqs: set[int] = set()
        nuids: set[str] = set()
        flushed = 0
        if table is not None:  # the long part, outside the lock
            flushed = self._from_table(table, subjects, infos, object_bucket, 0, seqs, nuids)
        with stream.lock:
            if stream.deleted:
                raise errors.StreamNotFoundError()
            stream.expire_now()
            buffer = stream.store.buffer  # type: ignore[attr-defined]
            known = set(nuids)
            if infos is not None and object_bucket is not None:
                nuids |= _nuids(buffer.matching(infos, with_data=True).values())
                subjects.add(chunk_subject(object_bucket, n) for n in nuids)
            if table is not None:  # what was flushed since the scan
                self._from_table(table, subjects, infos, object_bucket, flushed, seqs, nuids)
                new = nuids - known
                if new and object_bucket is not None:  # an object put since the scan: earlier chunks are in the table
                    chunks = _Subjects((chunk_subject(object_bucket, n) for n in new), tokens, keyed)
                    seqs.update(self._scan(table, chunks, 0, False).rows)
            seqs.update(buffer.matching(subjects))
            live = [stream.index.live_seqs(f) for f in (*subjects.literals, *subjects.wildcards)]
            found = np.unique(np.concatenate([np.fromiter(seqs, np.int64, len(seqs)), *live]))
            answer = self._queue_and_remove(stream, found, by)
            if by == "filter":
                self._shred(stream, filters[0], answer)
            return answer

    def _shred(self, stream: Stream, filter_: str, answer: dict[str, Any]) -> None:
        """Crypto-shredding (engine/encryption.py): when the filter selects a key prefix of an encrypted
        stream, its key goes now, and the request records when, beside the erase job's receipt."""
        shredded = encryption.shred(stream, filter_)
        record = fmt.read_request(self.layout, answer["id"]) if shredded is not None else None
        if shredded is None or record is None:
            return
        fmt.write_request(self.layout, {**record, **shredded})
        answer["key_destroyed"] = rfc3339(shredded["key_destroyed"])

    def _from_table(
        self,
        table: DeltaStore,
        subjects: _Subjects,
        infos: _Subjects | None,
        bucket: str | None,
        above: int,
        seqs: set[int],
        nuids: set[str],
    ) -> int:
        """Adds the table's matching sequences above `above` (and, for an object, the nuids of its
        infos, whose chunk subjects join `subjects`); returns how far the first snapshot read reaches."""
        watermark = None
        if infos is not None and bucket is not None:
            meta = self._scan(table, infos, above, True)
            watermark = meta.flushed
            nuids |= _nuids(meta.rows.values())
            subjects.add(chunk_subject(bucket, n) for n in nuids)
        rows = self._scan(table, subjects, above, False)
        seqs.update(rows.rows)
        return rows.flushed if watermark is None else watermark

    @staticmethod
    def _scan(store: DeltaStore, subjects: _Subjects, above: int, with_data: bool) -> stored.StoredRows:
        """The table's matching rows; an encrypted stream's values (object infos) are opened with its
        keys, so the chunks named by infos stored only in the table are found too."""
        sealer = store.sealer
        open_rows = (lambda rows: sealer.open(rows).table) if sealer is not None and with_data else None
        open_subjects = sealer.open_subjects if sealer is not None and sealer.protected else None
        return stored.scan(store.table, store.stream_id, subjects, subjects.partition, above, with_data, open_rows,
                           open_subjects)

    def _queue_and_remove(self, stream: Stream, seqs: np.ndarray, by: str) -> dict[str, Any]:
        """Under the stream's lock: the request first, then the removal from reads and from memory."""
        record = self._queue(stream, seqs, by)
        stream.erase_seqs(seqs)
        stream.forget_erased(seqs)
        return {"id": record["id"], "status": record["status"], "messages": record["messages"]}

    def _queue(self, stream: Stream, seqs: np.ndarray, by: str) -> dict[str, Any]:
        ranges = [[int(a), int(b)] for a, b in seq_ranges(np.sort(seqs))]
        record = {
            "id": uuid.uuid4().hex,
            "stream": stream.name,
            "stream_id": stream.stream_id,
            "ranges": ranges,
            "messages": int(len(seqs)),
            "by": by,
            "status": fmt.PENDING,
            "requested": stream.clock.now_ns(),
        }
        fmt.write_request(self.layout, record)
        return record

    def get(self, erasure_id: str) -> dict[str, Any]:
        """The request as the API shows it: `{"id","stream","status","messages","requested","completed"?,"receipt"?}`."""
        record = fmt.read_request(self.layout, erasure_id) if fmt.valid_id(erasure_id) else None
        if record is None:
            raise erasure_not_found()
        out: dict[str, Any] = {
            "id": record["id"],
            "stream": record["stream"],
            "status": record["status"],
            "messages": record["messages"],
            "requested": rfc3339(record["requested"]),
        }
        if record.get("key_destroyed"):
            out["key_destroyed"] = rfc3339(record["key_destroyed"])
        if record.get("completed"):
            out["completed"] = rfc3339(record["completed"])
        if record.get("receipt") is not None:
            out["receipt"] = record["receipt"]
        return out


def _nuids(infos: Iterable[bytes | None]) -> set[str]:
    """The nuids named by stored object infos (unreadable ones name none)."""
    out: set[str] = set()
    for data in infos:
        try:
            nuid = orjson.loads(data or b"{}").get("nuid")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(nuid, str) and nuid:
            out.add(nuid)
    return out


_registries: dict[str, ErasureRegistry] = {}
_registries_lock = threading.Lock()


def registry(layout: Layout) -> ErasureRegistry:
    """The registry of a warehouse account (one per process, made on first use)."""
    key = str(layout)
    with _registries_lock:
        found = _registries.get(key)
        if found is None:
            found = _registries[key] = ErasureRegistry(layout)
        return found
