"""Where everything lives in the warehouse, and the shape of the tables: shared with jobs/.

```
<warehouse>/<account>/streams/<STREAM>/     a Delta table per stream, partitioned by subject
<warehouse>/<account>/_system/streams/      stream configs (JSON, one file per stream)
<warehouse>/<account>/_system/tombstones/   logical deletions awaiting physical removal (Delta)
<warehouse>/<account>/_system/leases/       per-table commit leases
<warehouse>/<account>/_wal/<STREAM>/        write-ahead log segments not yet flushed
```
Column statistics are kept for `seq` and `ts` only, so no payload or subject value leaks into the
Delta log; deletions are keyed by sequence, never by subject.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

DEFAULT_ACCOUNT = "default"
PARTITION_COLUMN = "subject_partition"
CHECKPOINT_INTERVAL = 100

STREAM_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("msg_id", pa.string()),
        pa.field("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
        pa.field("data", pa.binary()),
        pa.field("size", pa.int32(), nullable=False),
        pa.field(PARTITION_COLUMN, pa.string(), nullable=False),
    ]
)

# An encrypted stream's table (engine/store/sealed.py): `data` and `headers` (the header map as JSON)
# hold values sealed in engine/keys/cipher.py's layout, which Spark's `aes_decrypt(..., 'GCM')` reads;
# `msg_id` (a header, so content) stays null. The other columns are the plain stream's.
SEALED_STREAM_SCHEMA = pa.schema(
    [pa.field("headers", pa.binary()) if f.name == "headers" else f for f in STREAM_SCHEMA]
)

TOMBSTONE_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("stream_id", pa.string(), nullable=False),
        pa.field("first_seq", pa.int64(), nullable=False),
        pa.field("last_seq", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("erase", pa.bool_(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

ACK_SCHEMA = pa.schema(
    [
        pa.field("event_seq", pa.int64(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("consumer_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("stream_seq", pa.int64(), nullable=False),
        pa.field("consumer_seq", pa.int64(), nullable=False),
        pa.field("delivery_count", pa.int32(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("delay", pa.int64(), nullable=False),
        pa.field("delivered_stream_seq", pa.int64()),
        pa.field("ack_floor_stream_seq", pa.int64()),
        pa.field("state", pa.string()),
    ]
)
ACK_TABLE_PROPERTIES = {
    "delta.dataSkippingStatsColumns": "event_seq,ts",
    "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
}

STREAM_TABLE_PROPERTIES = {
    "delta.dataSkippingStatsColumns": "seq,ts",
    "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
}
TOMBSTONE_TABLE_PROPERTIES = {
    "delta.dataSkippingStatsColumns": "first_seq,last_seq,ts",
    "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
}

_SAFE_PARTITION = re.compile(r"^[A-Za-z0-9_.$-]{1,120}$")


@lru_cache(maxsize=65536)
def partition_value(subject: str, tokens: int = 0) -> str:
    """The partition a subject's messages go to: the subject, or its first `tokens` tokens.

    Values that would make an awkward or over-long folder name get a short hash suffix instead.
    """
    prefix = ".".join(subject.split(".")[:tokens]) if tokens else subject
    if _SAFE_PARTITION.match(prefix):
        return prefix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.$-]", "_", prefix)[:64]
    return f"{readable}~{digest}"


NAMED_PARTITIONS = 48  # partition values named after a subject prefix, per stream
HASHED_PARTITIONS = 16  # buckets for the prefixes beyond them: at most 64 partitions a stream


class Partitioner:
    """A stream's partition values: the first `tokens` tokens of the subject (0: the whole subject, the
    layout of streams made before partitions were bounded, or of a stream that asks for it).

    With prefixes, the number of partitions stays bounded whatever the subjects: the first
    NAMED_PARTITIONS distinct prefixes get a folder of their own (`orders`, `$KV.config`), later ones
    share HASHED_PARTITIONS buckets (`~07`). A prefix keeps its partition for good: the names in use
    are read back from the table and the log on restart (`known`), so the same prefix never lands in
    two places. A stream capturing a handful of prefixes (the common case, and every KV bucket and
    object store) therefore has one readable folder per prefix.
    """

    def __init__(self, tokens: int, known: set[str] | None = None) -> None:
        self.tokens = tokens
        self._named: set[str] = {p for p in (known or ()) if not p.startswith("~")}
        self._cache: dict[str, str] = {}

    def names(self) -> set[str]:
        return set(self._named)

    def learn(self, values: set[str]) -> None:
        """Partition values found in the table or the log after a restart."""
        self._named |= {v for v in values if not v.startswith("~")}
        self._cache.clear()

    def __call__(self, subject: str) -> str:
        found = self._cache.get(subject)
        if found is not None:
            return found
        if not self.tokens:
            value = partition_value(subject)
        else:
            prefix = partition_value(subject, self.tokens)
            if prefix in self._named or (len(self._named) < NAMED_PARTITIONS and not prefix.startswith("~")):
                self._named.add(prefix)
                value = prefix
            else:
                value = "~%02d" % (int(hashlib.sha256(prefix.encode()).hexdigest()[:8], 16) % HASHED_PARTITIONS)
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[subject] = value
        return value


def file_name(name: str, suffix: str) -> str:
    """A file name for an asset: its name when that fits a file system's 255 bytes with room to spare
    (for `.tmp` siblings), else a readable prefix and a hash. Files hold the full name inside."""
    if len((name + suffix).encode()) <= 200:
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return name.encode()[:120].decode(errors="ignore") + "~" + digest + suffix


class Layout:
    """Paths of one account's tables and files in a warehouse."""

    def __init__(self, warehouse: str | Path, account: str = DEFAULT_ACCOUNT) -> None:
        self.warehouse = Path(warehouse).resolve()
        self.account = account
        self.root = self.warehouse / account

    def stream_table(self, stream: str) -> Path:
        return self.root / "streams" / stream

    @property
    def streams_dir(self) -> Path:
        return self.root / "streams"

    @property
    def stream_configs(self) -> Path:
        return self.root / "_system" / "streams"

    def stream_config(self, stream: str) -> Path:
        return self.stream_configs / file_name(stream, ".json")

    @property
    def tombstones_table(self) -> Path:
        return self.root / "_system" / "tombstones"

    @property
    def acks_table(self) -> Path:
        return self.root / "_system" / "acks"

    @property
    def consumer_configs(self) -> Path:
        return self.root / "_system" / "consumers"

    @property
    def acks_wal(self) -> Path:
        # A `.` cannot appear in a stream name, so this folder never collides with a stream's log.
        return self.root / "_wal" / ".acks"

    @property
    def leases(self) -> Path:
        return self.root / "_system" / "leases"

    def wal_dir(self, stream: str) -> Path:
        return self.root / "_wal" / stream

    @property
    def owner_lock(self) -> Path:
        return self.root / "_system" / "owner.lock"

    def index_snapshot(self, stream: str) -> Path:
        return self.root / "_system" / "index" / file_name(stream, ".idx")

    def lease_file(self, table: Path) -> Path:
        relative = str(table.resolve().relative_to(self.root)).replace("/", "__")
        return self.leases / file_name(relative, ".lease")


def account_names(warehouse: str | Path) -> list[str]:
    """The accounts that have a tree in the warehouse (a folder with `_system/`), sorted."""
    root = Path(warehouse)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "_system").is_dir())
