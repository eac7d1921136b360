"""How GDPR erasure requests are stored: one JSON file per request under `_system/erasures/`.

```
<warehouse>/<account>/_system/erasures/<id>.json
{"id": "<32 hex>", "stream": "ORDERS", "stream_id": "<hex>", "ranges": [[first, last], ...],
 "messages": N, "by": "seq" | "filter" | "delete", "status": "pending" | "done",
 "requested": <ns>, "completed": <ns>?, "receipt": {...}?}
```
A request holds no subject, no filter text and no payload: only sequence ranges (inclusive), so the
registry itself never keeps what it erases. Files rather than a Delta table: the gateway must make
a request durable before it answers (one small fsynced file, no commit lease, no table history that
would need its own cleanup), the erase job replaces one request's file when it is done (an atomic
rename: readers see the old or the new record, never half of one), and each file has one writer at
a time (the gateway creates it, the job then replaces it). The erase job reads and replaces them
through this module: the one reader and writer of the format.
"""

from __future__ import annotations

import re
import logging
import time
from pathlib import Path
from typing import Any

import orjson

from engine.store.layout import Layout
from engine.store.objectstore import ObjectNotFoundError, ObjectStoreError

log = logging.getLogger(__name__)

PENDING = "pending"
DONE = "done"
_ID = re.compile(r"^[0-9a-f]{32}$")


def erasures_dir(layout: Layout) -> Path:
    return layout.root / "_system" / "erasures"


def valid_id(erasure_id: str) -> bool:
    return bool(_ID.match(erasure_id))


def request_key(layout: Layout, erasure_id: str) -> str:
    if not valid_id(erasure_id):
        raise ValueError(f"invalid erasure id {erasure_id!r}")
    return f"{layout.erasures_key}/{erasure_id}.json"


def write_request(layout: Layout, record: dict[str, Any]) -> None:
    layout.objects.put(request_key(layout, record["id"]), orjson.dumps(record))


def read_request(layout: Layout, erasure_id: str) -> dict[str, Any] | None:
    try:
        return orjson.loads(layout.objects.get(request_key(layout, erasure_id)).data)  # type: ignore[no-any-return]
    except (ValueError, ObjectNotFoundError):
        return None


def remove_request(layout: Layout, erasure_id: str) -> None:
    layout.objects.delete(request_key(layout, erasure_id))


def pending_requests(layout: Layout) -> list[dict[str, Any]]:
    """Every pending request, oldest first; an unreadable object (damaged) is skipped."""
    records = []
    for meta in list(layout.objects.list(layout.erasures_key)):
        name = meta.key.rsplit("/", 1)[-1]
        if not name.endswith(".json") or not valid_id(name.removesuffix(".json")):
            continue
        try:
            record = orjson.loads(layout.objects.get(meta.key).data)
        except (ObjectStoreError, orjson.JSONDecodeError):
            log.warning("erasure request %s unreadable; skipped", name)
            continue
        if record.get("status") == PENDING:
            records.append(record)
    return sorted(records, key=lambda r: (r["requested"], r["id"]))


def mark_done(layout: Layout, record: dict[str, Any], receipt: dict[str, Any]) -> dict[str, Any]:
    """Replaces a request by its done form with the receipt (a whole-object put, durable at once)."""
    done = {**record, "status": DONE, "completed": time.time_ns(), "receipt": receipt}
    write_request(layout, done)
    return done
