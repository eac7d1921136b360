"""A removal's record in a stream's write-ahead log (beside rows.py's and sealed.py's record kinds).

The erase job knows its kind (jobs/erase.py: a log record that holds no message).
"""

from __future__ import annotations

import orjson

from engine.store.base import Removal

KIND_REMOVE = 2


def encode_removal(r: Removal) -> bytes:
    return orjson.dumps({"ranges": r.ranges, "reason": r.reason, "erase": r.erase, "last_seq": r.last_seq, "ts": r.ts})


def decode_removal(payload: bytes) -> Removal:
    d = orjson.loads(payload)
    return Removal([tuple(x) for x in d["ranges"]], d["reason"], d["erase"], d["last_seq"], d["ts"])
