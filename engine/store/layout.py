"""Where everything lives in the warehouse, and the shape of the tables: shared with jobs/.

```
<warehouse>/<account>/streams/<STREAM>/     a Delta table per stream, partitioned by subject
<warehouse>/<account>/_system/streams/      stream configs (JSON, one file per stream)
<warehouse>/<account>/_system/tombstones/   logical deletions awaiting physical removal (Delta)
<warehouse>/<account>/_system/consumers/    consumer configs (JSON, a folder per stream)
<warehouse>/<account>/_system/erasures/     erasure requests and receipts (JSON)
<warehouse>/<account>/_system/index/        index snapshots (one file per stream)
<warehouse>/<account>/_system/leases/       the owner lease and per-table commit leases (JSON)
<wal-dir>/<account>/_wal/<STREAM>/          write-ahead log segments not yet flushed (local disk)
<warehouse>/<account>/_log/<STREAM>/        the same, one object per group commit (`--wal object`)
<account-root>/_system/keys/                the keyring of an encrypted account (engine/keys/; local files)
```
The warehouse is a local folder or `s3://bucket/prefix` (objectstore/location.py). Shared state is
addressed by object keys (`*_key`) and reached through the warehouse's `ObjectStore`; Delta tables by
`TableLocation` (delta-rs URI, storage options, pyarrow file system). The write-ahead log stays on
local disk: under the warehouse for a local one, under `--wal-dir` for one on S3. The `Path`
accessors (`stream_table`, `stream_configs`, ...) exist for local warehouses only (the Spark jobs).
The keyring of an encrypted account (`keyring_folder(layout.root)`, engine/keys/) is a folder of
local files with its own fsync discipline: on a local warehouse it sits in the warehouse tree, beside
the shared state the local object store keeps there; on S3 it stays on the gateway's disk under
`--wal-dir`, like the local log (an encrypted account on S3 fails over only to a gateway that has
that folder).
Column statistics are kept for `seq` and `ts` only, so no payload or subject value leaks into the
Delta log; deletions are keyed by sequence, never by subject.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from engine.store.objectstore import ObjectStore, WarehouseLocation, to_spark_uri

DEFAULT_ACCOUNT = "default"
PARTITION_COLUMN = "subject_partition"
CHECKPOINT_INTERVAL = 100
DEFAULT_STATE_DIR = "./jetlake-state"  # local folder of the logs of a warehouse on S3

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
# An encrypted stream whose subjects are protected (`jetlake.protected_subjects`): `subject` holds the
# subject sealed in the same layout, and `subject_partition` a keyed hash (engine/keys/subjects.py).
PROTECTED_STREAM_SCHEMA = pa.schema(
    [pa.field("subject", pa.binary(), nullable=False) if f.name == "subject" else f for f in SEALED_STREAM_SCHEMA]
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


class KeyedHash(Protocol):
    """Keyed hashes of subject prefixes (engine/keys/subjects.py's SubjectHasher)."""

    def digest(self, prefix: str) -> bytes: ...

    def partition_value(self, prefix: str) -> str: ...


class Partitioner:
    """A stream's partition values: the first `tokens` tokens of the subject (0: the whole subject, the
    layout of streams made before partitions were bounded, or of a stream that asks for it).

    With prefixes, the number of partitions stays bounded whatever the subjects: the first
    NAMED_PARTITIONS distinct prefixes get a folder of their own (`orders`, `$KV.config`), later ones
    share HASHED_PARTITIONS buckets (`~07`). A prefix keeps its partition for good: the names in use
    are read back from the table and the log on restart (`known`), so the same prefix never lands in
    two places. A stream capturing a handful of prefixes (the common case, and every KV bucket and
    object store) therefore has one readable folder per prefix.

    With `keyed` (a stream whose subjects are protected) a prefix's value is its keyed hash instead,
    and the bucket of a prefix beyond the named ones is chosen by that hash too: no folder name is
    computable from a subject without the stream's key.
    """

    def __init__(self, tokens: int, known: set[str] | None = None, keyed: KeyedHash | None = None) -> None:
        self.tokens = tokens
        self.keyed = keyed
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
            value = self._named_value(subject)
        else:
            prefix = self._named_value(self._prefix(subject))
            if prefix in self._named or (len(self._named) < NAMED_PARTITIONS and not prefix.startswith("~")):
                self._named.add(prefix)
                value = prefix
            else:
                value = self._bucket(self._prefix(subject))
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[subject] = value
        return value

    def column(self, subjects: pa.StringArray) -> pa.StringArray:
        """The partition of every subject of a column: computed once per distinct prefix, in the order
        of first sight (the named partitions are handed out as one call per subject would)."""
        if self.tokens:
            head = r"^((?:[^.]*\.){%d}[^.]*)\..*$" % (self.tokens - 1)
            subjects = pc.replace_substring_regex(subjects, head, r"\1")
        encoded = pc.dictionary_encode(subjects)
        values = pa.array([self(value) for value in encoded.dictionary.to_pylist()], pa.string())
        return pc.take(values, encoded.indices)

    def values_for(self, filter_subject: str) -> set[str] | None:
        """The partition values that may hold subjects matching `filter_subject`, without assigning
        any; None when any partition may (a wildcard within the partition's tokens)."""
        head = filter_subject.split(".")
        if self.tokens:
            head = head[: self.tokens]  # a shorter subject's partition is the whole subject
        if "*" in head or ">" in head:
            return None
        prefix = ".".join(head)
        if not self.tokens:
            return {self._named_value(prefix)}
        return {self._named_value(prefix), self._bucket(prefix)}

    def _prefix(self, subject: str) -> str:
        return ".".join(subject.split(".")[: self.tokens])

    def _named_value(self, prefix: str) -> str:
        """A prefix's (or with 0 tokens a subject's) own partition value."""
        return self.keyed.partition_value(prefix) if self.keyed is not None else partition_value(prefix)

    def _bucket(self, prefix: str) -> str:
        if self.keyed is not None:
            number = int.from_bytes(self.keyed.digest(prefix)[:4], "big")
        else:
            number = int(hashlib.sha256(partition_value(prefix).encode()).hexdigest()[:8], 16)
        return "~%02d" % (number % HASHED_PARTITIONS)


def file_name(name: str, suffix: str) -> str:
    """A file name for an asset: its name when that fits a file system's 255 bytes with room to spare
    (for `.tmp` siblings), else a readable prefix and a hash. Files hold the full name inside."""
    if len((name + suffix).encode()) <= 200:
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return name.encode()[:120].decode(errors="ignore") + "~" + digest + suffix


@dataclass(frozen=True)
class TableLocation:
    """A Delta table of the warehouse as each client reaches it: delta-rs by `uri` and
    `storage_options`, pyarrow by `file(relative)` on `filesystem`, the object store by `key`."""

    uri: str
    key: str
    storage_options: dict[str, str] | None = field(default=None, hash=False, compare=False)
    location: WarehouseLocation = field(default_factory=WarehouseLocation, hash=False, compare=False)

    @property
    def local_path(self) -> Path | None:
        """The table's folder on a local warehouse (None on S3)."""
        return Path(self.uri) if self.location.root is not None else None

    @property
    def objects(self) -> ObjectStore:
        """The warehouse's object store, where the table's files are objects under `key`."""
        return _open_store(self.location)

    @property
    def filesystem(self) -> Any:
        """pyarrow's file system for the table's data files (None: local paths)."""
        return _arrow_filesystem(self.location)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def spark_uri(self) -> str:
        """Spark's path of the table (`s3a://…` on S3)."""
        return to_spark_uri(self.uri)

    def file(self, relative: str) -> str:
        """A data file's path (relative as in the Delta log, unquoted) for `filesystem`."""
        if self.location.root is not None:
            return f"{self.uri}/{relative}"
        return self.uri.removeprefix("s3://") + "/" + relative

    def __str__(self) -> str:
        return self.uri


@lru_cache(maxsize=16)
def _arrow_filesystem(location: WarehouseLocation) -> Any:
    return None if location.s3 is None else location.s3.arrow_filesystem()


@lru_cache(maxsize=16)
def _open_store(location: WarehouseLocation) -> ObjectStore:
    """One store per warehouse and process (a client and its connection pool, shared by the accounts)."""
    return location.open()


class Layout:
    """Keys, tables and log folders of one account in a warehouse.

    Args:
        warehouse: a local folder or `s3://bucket/prefix` (or its parsed location).
        account: the account whose tree this is.
        wal_dir: the local folder under which the write-ahead logs live (`<wal_dir>/<account>/_wal`);
            default: the warehouse itself when local, `./jetlake-state` when on S3.
    """

    def __init__(self, warehouse: str | Path | WarehouseLocation, account: str = DEFAULT_ACCOUNT,
                 wal_dir: str | Path | None = None) -> None:
        self.location = warehouse if isinstance(warehouse, WarehouseLocation) else WarehouseLocation.parse(warehouse)
        self.account = account
        self.warehouse: Path | str = self.location.root if self.location.root is not None else self.location.uri()
        local = Path(wal_dir) if wal_dir else self.location.root or Path(DEFAULT_STATE_DIR)
        self.wal_dir_root = local.resolve() / account
        # the account's local folder: in the warehouse when local, the logs' folder when on S3 (logs name it)
        self.root = self.location.root / account if self.location.root is not None else self.wal_dir_root

    @property
    def is_s3(self) -> bool:
        return self.location.is_s3

    @property
    def objects(self) -> ObjectStore:
        """The warehouse's object store (shared state: configs, leases, snapshots, erasure requests)."""
        return _open_store(self.location)

    def __str__(self) -> str:
        return self.location.uri(self.account)

    # -- keys of shared state (through `objects`) ---------------------------------------------

    def key(self, *parts: str) -> str:
        return "/".join((self.account, *parts))

    @property
    def stream_configs_key(self) -> str:
        return self.key("_system", "streams")

    def stream_config_key(self, stream: str) -> str:
        return self.key("_system", "streams", file_name(stream, ".json"))

    @property
    def consumer_configs_root_key(self) -> str:
        return self.key("_system", "consumers")

    def consumer_configs_key(self, stream: str) -> str:
        return self.key("_system", "consumers", file_name(stream, ""))

    def consumer_config_key(self, stream: str, consumer: str) -> str:
        return self.key("_system", "consumers", file_name(stream, ""), file_name(consumer, ".json"))

    @property
    def erasures_key(self) -> str:
        return self.key("_system", "erasures")

    def index_snapshot_key(self, stream: str) -> str:
        return self.key("_system", "index", file_name(stream, ".idx"))

    @property
    def owner_key(self) -> str:
        return self.key("_system", "leases", "owner.json")

    def stream_lease_key(self, stream: str) -> str:
        """A stream's ownership lease when several gateways share the warehouse (engine/cluster/ownership.py)."""
        return self.key("_system", "leases", "streams", file_name(stream, ".json"))

    def lease_key(self, table: TableLocation | Path) -> str:
        """The commit lease of a table (`TableLocation` or, from the jobs, a local table path)."""
        table_key = table.key if isinstance(table, TableLocation) else str(
            Path(table).resolve().relative_to(self._local_root()))
        relative = table_key.removeprefix(self.account + "/").replace("/", "__")
        return self.key("_system", "leases", file_name(relative, ".json"))

    # -- Delta tables -------------------------------------------------------------------------

    def table(self, *parts: str) -> TableLocation:
        key = self.key(*parts)
        return TableLocation(self.location.uri(key), key, self.location.storage_options(), self.location)

    def stream_table_location(self, stream: str) -> TableLocation:
        return self.table("streams", stream)

    @property
    def tombstones(self) -> TableLocation:
        return self.table("_system", "tombstones")

    @property
    def acks(self) -> TableLocation:
        return self.table("_system", "acks")

    # -- local folders: the write-ahead logs --------------------------------------------------

    @property
    def acks_wal(self) -> Path:
        # A `.` cannot appear in a stream name, so this folder never collides with a stream's log.
        return self.wal_dir_root / "_wal" / ".acks"

    def wal_dir(self, stream: str) -> Path:
        return self.wal_dir_root / "_wal" / stream

    def object_log_key(self, stream: str) -> str:
        """The folder of a stream's log (or `.acks`) in the object store, with `--wal object`."""
        return self.key("_log", stream)

    # -- local paths (local warehouses only: the Spark jobs' view) ----------------------------

    def _local_root(self) -> Path:
        if self.location.root is None:
            raise ValueError(f"{self.location.uri()} is on object storage: it has no local paths")
        return self.location.root / self.account

    def stream_table(self, stream: str) -> Path:
        return self._local_root() / "streams" / stream

    @property
    def streams_dir(self) -> Path:
        return self._local_root() / "streams"

    @property
    def stream_configs(self) -> Path:
        return self._local_root() / "_system" / "streams"

    def stream_config(self, stream: str) -> Path:
        return self.stream_configs / file_name(stream, ".json")

    @property
    def tombstones_table(self) -> Path:
        return self._local_root() / "_system" / "tombstones"

    @property
    def acks_table(self) -> Path:
        return self._local_root() / "_system" / "acks"

    @property
    def consumer_configs(self) -> Path:
        return self._local_root() / "_system" / "consumers"

    @property
    def leases(self) -> Path:
        return self._local_root() / "_system" / "leases"

    def index_snapshot(self, stream: str) -> Path:
        return self._local_root() / "_system" / "index" / file_name(stream, ".idx")

    def lease_file(self, table: Path | TableLocation) -> CommitLeaseRef:
        """The commit lease of a table, for `engine.store.lease.commit_lease` (the jobs call this)."""
        return CommitLeaseRef(self.objects, self.lease_key(table))


@dataclass(frozen=True)
class CommitLeaseRef:
    """Where a table's commit lease lives: the warehouse's store and the lease's key."""

    store: ObjectStore = field(hash=False, compare=False)
    key: str


def account_names(warehouse: str | Path) -> list[str]:
    """The accounts that have a tree in the warehouse (objects under `<account>/_system/`), sorted."""
    location = WarehouseLocation.parse(warehouse)
    if location.root is not None:
        root = location.root
        return sorted(p.name for p in root.iterdir() if (p / "_system").is_dir()) if root.is_dir() else []
    names = {meta.key.split("/", 1)[0] for meta in _open_store(location).list() if "/_system/" in meta.key}
    return sorted(names)
