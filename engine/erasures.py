"""GDPR erasure requests: resolve what to erase, make it unreadable at once, queue it for the erase job.

`POST /v1/erasures {"stream", "seq"? | "filter"?}` names one sequence or every live message whose
subject matches a filter. Under the stream's lock the registry resolves the sequences, writes the
request durably (sequence ranges only: no subject, no filter text; format in engine/store/erasures.py),
then removes the messages from every read through `Stream.erase_seqs` (tombstones with reason
"erase" and erase=True). The request is written before the removal: a crash in between leaves a
request for messages still readable, which the job erases anyway, never erased messages that no
request will ever remove physically. `DELETE .../messages/{seq}` without `no_erase` queues a
request the same way (`delete_and_queue`).

GDPR wins over a stream's `deny_delete` and `sealed` for `POST /v1/erasures`; the plain delete route
keeps JetStream's checks. A `seq` that is no longer live but not past the end (deleted earlier with
`no_erase`, or purged) is still accepted: its row may be in the table until a job removes it.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import numpy as np

from engine import errors
from engine.errors import ErrorCode, JetStreamError
from engine.index import seq_ranges
from engine.info import rfc3339
from engine.store import erasures as fmt
from engine.store.layout import Layout
from engine.stream import Stream
from engine.subjects import is_valid_subject


def erasure_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.BAD_REQUEST, "erasure request not found")


class ErasureRegistry:
    """The erasure requests of one account's warehouse."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def erase(self, stream: Stream, seq: int | None = None, filter_: str | None = None) -> dict[str, Any]:
        """Queues an erasure of one sequence or of the live messages matching `filter_`; they leave
        every read before this returns. Returns `{"id", "status", "messages"}`."""
        if (seq is None) == (filter_ is None):
            raise errors.bad_request("give one of seq or filter")
        if filter_ is not None and not is_valid_subject(filter_):
            raise errors.bad_request("invalid subject filter")
        with stream.lock:
            if stream.deleted:
                raise errors.StreamNotFoundError()
            stream.expire_now()
            if seq is not None:
                if seq <= 0:
                    raise errors.bad_request("a message sequence must be a positive integer")
                if seq > stream.index.last_seq:
                    raise errors.sequence_not_found(seq)
                seqs = np.array([seq], np.int64)
                by = "seq"
            else:
                seqs = stream.index.live_seqs(filter_)
                by = "filter"
            record = self._queue(stream, seqs, by)
            stream.erase_seqs(seqs)
        return {"id": record["id"], "status": record["status"], "messages": record["messages"]}

    def delete_and_queue(self, stream: Stream, seq: int) -> None:
        """`DELETE .../messages/{seq}` with erasure: JetStream's delete checks, then a queued request."""
        with stream.lock:
            record = self._queue(stream, np.array([seq], np.int64), "delete")
            try:
                stream.delete_message(seq, erase=True)
            except BaseException:
                fmt.remove_request(self.layout, record["id"])
                raise

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
        if record.get("completed"):
            out["completed"] = rfc3339(record["completed"])
        if record.get("receipt") is not None:
            out["receipt"] = record["receipt"]
        return out


_registries: dict[str, ErasureRegistry] = {}
_registries_lock = threading.Lock()


def registry(layout: Layout) -> ErasureRegistry:
    """The registry of a warehouse account (one per process, made on first use)."""
    key = str(layout.root)
    with _registries_lock:
        found = _registries.get(key)
        if found is None:
            found = _registries[key] = ErasureRegistry(layout)
        return found
