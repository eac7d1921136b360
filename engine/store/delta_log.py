"""A Delta table's transaction log, read and written here (the Delta protocol, delta.md) rather than
through delta-rs.

The gateway only ever appends files to its tables, deletes the ack table's folded rows and writes a
checkpoint now and then; Spark's jobs do the rest. delta-rs's module for that cost the gateway about
35 MB of RSS (26 MB of its 134 MB library mapped at import, more once it committed, and its own
heap), as much as the index of a million subjects. The log is replayed once, from the last checkpoint
(delta_checkpoint.py) and the commits after it, then followed commit by commit: a refresh reads the
next commit objects until one is missing. A commit is one put-if-absent of its JSON (`ObjectStore.
create`: a hard link on a local warehouse, a conditional PUT on S3), as delta-rs makes it.
The actions and the state they add up to are delta_actions.py's.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import orjson
import pyarrow as pa

from engine.store import delta_checkpoint
from engine.store.delta_actions import LogState, applied, apply, check_protocol, now_ms
from engine.store.layout import TableLocation
from engine.store.objectstore import ObjectExistsError, ObjectNotFoundError

READER_VERSION, WRITER_VERSION = 1, 2  # what the tables are created with, and all this module reads and writes
ENGINE_INFO = "jetlake"


class TableNotFoundError(Exception):
    """The table has no log (it was never created, or was deleted)."""


class CommitConflictError(Exception):
    """Another writer took the commit's version first."""


_logs: dict[str, DeltaLog] = {}  # by table URI: one replay per table and process
_logs_lock = threading.Lock()


def log_of(table: TableLocation) -> DeltaLog:
    """The process's log of `table` (the account's tombstones table is shared by all its streams)."""
    with _logs_lock:
        found = _logs.get(table.uri)
        if found is None:
            found = _logs[table.uri] = DeltaLog(table)
        return found


def drop(table: TableLocation) -> None:
    """Forgets `table`'s log (the table was deleted, or is made anew)."""
    with _logs_lock:
        _logs.pop(table.uri, None)


class DeltaLog:
    """The log of one table, replayed once and followed after that. Thread-safe: the flusher commits
    while readers ask for the state."""

    __slots__ = ("table", "_state", "_lock")

    def __init__(self, table: TableLocation) -> None:
        self.table = table
        self._state: LogState | None = None
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return log_key(self.table)

    def state(self, refresh: bool = True) -> LogState:
        """The table's state: the latest version when `refresh`, else as last read. Raises
        TableNotFoundError when it has no log."""
        with self._lock:
            if self._state is None:
                self._state = self._replay()
            elif refresh:
                self._state = self._follow(self._state)
            return self._state

    def forget(self) -> None:
        """The table was deleted or made anew: the next question replays its log."""
        with self._lock:
            self._state = None

    def exists(self) -> bool:
        try:
            self.state()
        except TableNotFoundError:
            return False
        return True

    def create(self, schema: pa.Schema, partition_by: list[str] | None, configuration: dict[str, str]) -> bool:
        """Creates the table (version 0: its protocol and metadata); False if its first commit exists."""
        now = now_ms()
        metadata = {"id": str(uuid.uuid4()), "name": None, "description": None,
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": orjson.dumps(delta_schema(schema)).decode(),
                    "partitionColumns": list(partition_by or []), "createdTime": now, "configuration": configuration}
        actions = [{"commitInfo": _commit_info("CREATE TABLE", {"mode": "ErrorIfExists"}, now)},
                   {"protocol": {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION}},
                   {"metaData": metadata}]
        try:
            self.table.objects.create(f"{self.key}/{commit_name(0)}", _lines(actions))
        except ObjectExistsError:
            return False
        self.forget()
        return True

    def commit(self, base: LogState, actions: list[dict[str, Any]], operation: str,
               parameters: dict[str, Any] | None = None) -> int:
        """Writes the version after `base` (the state the caller read and decided on) with `actions`,
        after a commitInfo; returns it. Raises CommitConflictError when that version exists already
        (another writer, which `base` did not see), DeltaProtocolError when the table needs a writer
        this is not."""
        check_protocol(base.protocol, write=True)
        version = base.version + 1
        body = _lines([{"commitInfo": _commit_info(operation, parameters or {}, now_ms())}, *actions])
        try:
            self.table.objects.create(f"{self.key}/{commit_name(version)}", body)
        except ObjectExistsError:
            raise CommitConflictError(f"{self.table}: version {version} was committed by another writer") from None
        with self._lock:
            if self._state is not None and self._state.version == base.version:
                self._state = applied(self._state, version, actions)
        return version

    def checkpoint(self) -> int:
        """Writes a checkpoint of the latest version, then removes log entries past their retention
        (delta_checkpoint.py); returns the version checkpointed."""
        state = self.state()
        kept = delta_checkpoint.write(self.table.objects, self.key, state)
        with self._lock:  # expired tombstones leave the memory too
            if self._state is not None and self._state.removed.keys() - kept:
                self._state = self._state.copy()
                self._state.removed = {p: r for p, r in self._state.removed.items() if p in kept}
        delta_checkpoint.clean_up(self.table.objects, self.key, state)
        return state.version

    # -- replay -------------------------------------------------------------------------------

    def _replay(self) -> LogState:
        pointer = delta_checkpoint.last_checkpoint(self.table.objects, self.key)
        if pointer is None:
            state = LogState()
            if not self._apply_commits(state):
                raise TableNotFoundError(str(self.table))
            return state
        state = delta_checkpoint.read(self.table.objects, self.key, pointer)
        self._apply_commits(state)
        check_protocol(state.protocol, write=False)
        return state

    def _follow(self, state: LogState) -> LogState:
        """`state` brought to the latest version (a copy when commits followed it); replayed again if a
        checkpoint overtook it (older commits may be cleaned up by then)."""
        following = self._read_commit(state.version + 1)
        if following is not None:
            followed = state.copy()
            apply(followed, state.version + 1, following)
            self._apply_commits(followed)
            return followed
        pointer = delta_checkpoint.last_checkpoint(self.table.objects, self.key)
        if pointer is not None and int(pointer["version"]) > state.version:
            return self._replay()
        return state

    def _apply_commits(self, state: LogState) -> bool:
        """Applies the commits after `state.version` in order, in place; whether there was any."""
        found = False
        while (actions := self._read_commit(state.version + 1)) is not None:
            apply(state, state.version + 1, actions)
            found = True
        return found

    def _read_commit(self, version: int) -> list[dict[str, Any]] | None:
        try:
            data = self.table.objects.get(f"{self.key}/{commit_name(version)}").data
        except ObjectNotFoundError:
            return None
        return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def log_key(table: TableLocation) -> str:
    """The key of the table's `_delta_log/` folder in its object store."""
    return f"{table.key}/_delta_log"


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


def _commit_info(operation: str, parameters: dict[str, Any], at_ms: int) -> dict[str, Any]:
    return {"timestamp": at_ms, "operation": operation, "operationParameters": parameters,
            "engineInfo": ENGINE_INFO, "clientVersion": ENGINE_INFO}


def _lines(actions: list[dict[str, Any]]) -> bytes:
    return b"\n".join(orjson.dumps(action) for action in actions) + b"\n"


# -- schemas ----------------------------------------------------------------------------------


def delta_schema(schema: pa.Schema) -> dict[str, Any]:
    """The Delta schema (its `schemaString` JSON) of an Arrow schema."""
    return {"type": "struct", "fields": [_delta_field(f.name, f.type, f.nullable) for f in schema]}


def _delta_field(name: str, arrow_type: pa.DataType, nullable: bool) -> dict[str, Any]:
    return {"name": name, "type": _delta_type(arrow_type), "nullable": nullable, "metadata": {}}


_PRIMITIVES = {pa.int64(): "long", pa.int32(): "integer", pa.int16(): "short", pa.int8(): "byte",
               pa.string(): "string", pa.large_string(): "string", pa.binary(): "binary",
               pa.large_binary(): "binary", pa.bool_(): "boolean", pa.float64(): "double", pa.float32(): "float",
               pa.date32(): "date"}


def _delta_type(arrow_type: pa.DataType) -> Any:
    if arrow_type in _PRIMITIVES:
        return _PRIMITIVES[arrow_type]
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        return "timestamp"
    if pa.types.is_map(arrow_type):
        return {"type": "map", "keyType": _delta_type(arrow_type.key_type),
                "valueType": _delta_type(arrow_type.item_type), "valueContainsNull": arrow_type.item_field.nullable}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return {"type": "array", "elementType": _delta_type(arrow_type.value_type),
                "containsNull": arrow_type.value_field.nullable}
    if pa.types.is_struct(arrow_type):
        return {"type": "struct", "fields": [_delta_field(f.name, f.type, f.nullable) for f in arrow_type]}
    raise ValueError(f"no Delta type for {arrow_type}")
