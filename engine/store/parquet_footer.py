"""A Parquet file's row groups as reads choose them: compact bounds kept, a small footer parsed per read.

A stream file's footer holds an entry per row group (1,024 rows): ~780 bytes serialized, several KB
once pyarrow has parsed it. At 100 M messages a table has ~224 files of 300-400 groups whose parsed
footers (2-3 MB each) do not fit the row-group cache, and each random read parsed one again (3.7 ms)
and walked its statistics (5 ms). Here a file's footer is read once into `FileBounds`: per row group
its lowest and highest `seq`, highest `ts`, rows, optional columns without a value and where its entry
lies in the file (41 bytes a group), plus the footer's other fields (schema and key-value metadata,
~1 KB a file). A read then fetches the entries of the groups it decodes (a few hundred bytes) and has
pyarrow parse a footer made of those alone (~0.2 ms): the entries keep the file's own column chunk
offsets, so the columns are read from the file as they would be with its whole footer. Where a
table's footers are few enough to keep parsed (`whole_metadata`, ~7 KB a group; table_reads.py
decides), a read parses nothing.
The footer is Thrift's compact protocol (parquet.thrift's `FileMetaData`, whose fields Thrift writes
in field order); only its top-level fields and the extent of each `RowGroup` are walked here, pyarrow
parses the rest. Counterpart: server/filestore.go keeps every `msgBlock`'s first/last sequence and
time at hand and loads a block's messages on demand (`loadMsgs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = b"PAR1"
_TAIL_GUESS = 64 * 1024  # bytes read from a file's end at once: most footers of small files fit
_NUM_ROWS, _ROW_GROUPS = 3, 4  # FileMetaData's field ids
_I64, _LIST, _STRUCT = 6, 9, 12  # compact protocol types
_FIXED_SIZE = {1: 0, 2: 0, 3: 1, 7: 8, 13: 16}  # bool true/false (in the type), byte, double, uuid
_UNKNOWN_HIGH = 2**62  # a statistic that is missing: never pruned
_SCHEMA_BYTES = 2048  # what a file's Arrow schema is charged (shared fields, a dozen columns)
# A footer parsed by pyarrow holds ~9 bytes of memory per serialized byte (measured: 47 row groups,
# 38 KB serialized, 332 KB parsed; one group, 1.9 KB serialized, 20 KB parsed).
_PARSED_PER_BYTE = 9


class FileBounds:
    """What reads choose a file's row groups by, and the bytes that make a footer of some of them.

    `lows`/`highs`: each group's `seq` statistics (-1 / 2**62 when missing); `last_ts`: its highest
    `ts` in microseconds (2**62 when unknown); `nulls`: a bit per name of `optional`, set when the
    group holds no value of that column (statistics say every value is null), so it need not be read.
    """

    def __init__(self, meta: pq.FileMetaData, schema: pa.Schema, footer: bytes, footer_at: int,
                 optional: Sequence[str]) -> None:
        self.schema = schema
        groups = meta.num_row_groups
        fields, entries = _walk_footer(footer)
        if len(entries) != groups or [fid for fid, _, _ in fields].count(_ROW_GROUPS) != 1:
            raise ValueError(f"a Parquet footer of {groups} row groups walked as {len(entries)}")
        self.footer_at = footer_at
        self.size = footer_at + len(footer) + 8  # the file's length: a file rewritten in place differs
        self.checked = True  # read from the file itself (bounds from a snapshot are checked at first use)
        self.parsed_nbytes = _PARSED_PER_BYTE * len(footer)  # the whole footer, were it kept parsed
        self.starts = np.array([footer_at + start for start, _ in entries], np.int64)
        self.ends = np.array([footer_at + end for _, end in entries], np.int64)
        self._head, self._head_last, self._tail = _split_fields(fields)
        names = schema.names
        seq, ts = names.index("seq"), names.index("ts")
        chunks = [meta.row_group(i) for i in range(groups)]
        self.rows = np.array([g.num_rows for g in chunks], np.int64)
        seq_stats = [g.column(seq).statistics for g in chunks]
        self.lows = np.array([st.min if st is not None and st.has_min_max else -1 for st in seq_stats], np.int64)
        self.highs = np.array([st.max if st is not None and st.has_min_max else _UNKNOWN_HIGH for st in seq_stats],
                              np.int64)
        self.last_ts = np.array([_last_us(g.column(ts).statistics) for g in chunks], np.int64)
        width = chunks[0].num_columns if groups else 0  # not `meta.schema`: it ties a reference cycle
        leaves = [chunks[0].column(i).path_in_schema.split(".")[0] for i in range(width)]
        self.leaves: dict[str, list[int]] = {}  # a top-level column's leaf columns (a map has two)
        for i, leaf in enumerate(leaves):
            self.leaves.setdefault(leaf, []).append(i)
        self.optional = [name for name in optional if name in names]
        self.nulls = np.zeros(groups, np.uint8)
        for bit, name in enumerate(self.optional):
            empty = np.array([all(_all_null(g.column(i)) for i in self.leaves[name]) for g in chunks], np.bool_)
            self.nulls |= empty.astype(np.uint8) << bit

    @classmethod
    def read(cls, path: str, filesystem: Any, optional: Sequence[str] = ()) -> FileBounds:
        """The file's bounds, from its footer read once; no parsed footer is kept (pyarrow's
        `FileMetaData.schema` would also tie one in a reference cycle: the schema comes from the reader)."""
        with filesystem.open_input_file(path) as file:
            size = file.size()
            tail = file.read_at(min(size, _TAIL_GUESS), size - min(size, _TAIL_GUESS))
            if len(tail) < 12 or tail[-4:] != MAGIC:
                raise ValueError(f"{path} is not a Parquet file (or its footer is encrypted)")
            length = int.from_bytes(tail[-8:-4], "little")
            footer_at = size - 8 - length
            if length + 8 <= len(tail):
                footer = tail[len(tail) - 8 - length : -8]
            else:
                footer = file.read_at(length, footer_at)
        reader = pq.ParquetFile(pa.BufferReader(footer + tail[-8:]))
        return cls(reader.metadata, reader.schema_arrow, footer, footer_at, optional)

    def __len__(self) -> int:
        return len(self.lows)

    @property
    def nbytes(self) -> int:
        arrays = (self.starts, self.ends, self.rows, self.lows, self.highs, self.last_ts, self.nulls)
        return sum(a.nbytes for a in arrays) + len(self._head) + len(self._tail) + _SCHEMA_BYTES

    def empty(self, group: int, name: str) -> bool:
        """Whether the group holds no value of the optional column `name`."""
        return name in self.optional and bool(self.nulls[group] >> self.optional.index(name) & 1)

    def describes(self, file: pa.NativeFile) -> bool:
        """Whether `file` still ends in the footer these bounds describe: its length and magic where they
        were, its first fields as they were. Bounds kept in an index snapshot may meet a file rewritten in
        place under its name at the same size (a size check alone passes) — two small reads, once a file."""
        length = self.size - 8 - self.footer_at
        return (file.read_at(8, self.size - 8) == length.to_bytes(4, "little") + MAGIC
                and file.read_at(len(self._head), self.footer_at) == self._head)

    def whole_metadata(self, file: pa.NativeFile) -> pq.FileMetaData:
        """The file's whole footer, parsed: worth keeping where a table's footers all fit the cache
        (a read through it then costs no parse: ~0.25 ms of a point read's ~0.5)."""
        length = self.size - 8 - self.footer_at
        footer = file.read_at(length, self.footer_at)
        return pq.read_metadata(pa.BufferReader(footer + length.to_bytes(4, "little") + MAGIC))

    def metadata(self, file: pa.NativeFile, groups: Sequence[int]) -> pq.FileMetaData:
        """A footer holding only `groups` (in that order; read them as 0..n-1): their entries are read
        from `file`, consecutive ones at once."""
        rows = int(self.rows[list(groups)].sum())
        parts = [self._head, _field_header(_NUM_ROWS, _I64, self._head_last) + _varint(_zigzag(rows)),
                 _field_header(_ROW_GROUPS, _LIST, _NUM_ROWS) + _list_header(len(groups), _STRUCT)]
        run_start = 0
        for i in range(1, len(groups) + 1):
            if i == len(groups) or groups[i] != groups[i - 1] + 1:
                first, last = groups[run_start], groups[i - 1]
                start = int(self.starts[first])
                parts.append(file.read_at(int(self.ends[last]) - start, start))
                run_start = i
        parts.append(self._tail)
        footer = b"".join(parts)
        return pq.read_metadata(pa.BufferReader(footer + len(footer).to_bytes(4, "little") + MAGIC))


def _last_us(stats: pq.Statistics | None) -> int:
    """A `ts` chunk's highest value in microseconds; 2**62 (never skipped) without statistics or for a
    legacy INT96 column."""
    if stats is None or not stats.has_min_max or not isinstance(stats.max_raw, int):
        return _UNKNOWN_HIGH
    return stats.max_raw


def _all_null(chunk: pq.ColumnChunkMetaData) -> bool:
    """Whether a column chunk holds only nulls (a map column: null or empty maps), by its statistics;
    False when it has none."""
    stats = chunk.statistics
    return stats is not None and stats.has_null_count and stats.null_count == chunk.num_values


# -- Thrift's compact protocol ------------------------------------------------------------------


def _walk_footer(buf: bytes) -> tuple[list[tuple[int, int, bytes]], list[tuple[int, int]]]:
    """FileMetaData's top-level fields as (id, type, value bytes), and the (start, end) of each
    RowGroup entry of field 4 (whose value bytes are left empty here)."""
    fields: list[tuple[int, int, bytes]] = []
    entries: list[tuple[int, int]] = []
    pos = last = 0
    while True:
        head = buf[pos]
        pos += 1
        kind = head & 0x0F
        if not kind:
            return fields, entries
        if head >> 4:
            fid = last + (head >> 4)
        else:
            raw, pos = _read_varint(buf, pos)
            fid = (raw >> 1) ^ -(raw & 1)
        last, start = fid, pos
        if fid == _ROW_GROUPS and kind == _LIST:
            count, elem, pos = _read_list_header(buf, pos)
            if elem != _STRUCT:
                raise ValueError("a Parquet footer whose row groups are not structs")
            for _ in range(count):
                begin, pos = pos, _skip_struct(buf, pos)
                entries.append((begin, pos))
            fields.append((fid, kind, b""))
        else:
            pos = _skip(buf, pos, kind)
            fields.append((fid, kind, buf[start:pos]))


def _split_fields(fields: list[tuple[int, int, bytes]]) -> tuple[bytes, int, bytes]:
    """The encoded fields before `num_rows` (and the id of the last of them) and after `row_groups`
    (up to the struct's end), whose field headers are rewritten for their new neighbours. Thrift
    writes fields in id order."""
    ids = [fid for fid, _, _ in fields]
    if sorted(ids) != ids or _NUM_ROWS not in ids or ids.index(_ROW_GROUPS) != ids.index(_NUM_ROWS) + 1:
        raise ValueError(f"a Parquet footer with fields {ids}")
    head, tail = bytearray(), bytearray()
    last = head_last = 0
    for fid, kind, value in fields:
        if fid < _NUM_ROWS:
            head += _field_header(fid, kind, last) + value
            head_last = fid
        elif fid > _ROW_GROUPS:
            tail += _field_header(fid, kind, last) + value
        last = fid
    tail.append(0)  # the struct's stop
    return bytes(head), head_last, bytes(tail)


def _field_header(fid: int, kind: int, last: int) -> bytes:
    delta = fid - last
    return bytes([delta << 4 | kind]) if 0 < delta <= 15 else bytes([kind]) + _varint(_zigzag(fid))


def _list_header(count: int, elem: int) -> bytes:
    return bytes([count << 4 | elem]) if count < 15 else bytes([0xF0 | elem]) + _varint(count)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _read_list_header(buf: bytes, pos: int) -> tuple[int, int, int]:
    head = buf[pos]
    count, elem = head >> 4, head & 0x0F
    pos += 1
    if count == 15:
        count, pos = _read_varint(buf, pos)
    return count, elem, pos


def _skip(buf: bytes, pos: int, kind: int) -> int:
    """The position after a value of type `kind` starting at `pos`."""
    if kind in (4, 5, 6):  # i16, i32, i64: one varint
        while buf[pos] & 0x80:
            pos += 1
        return pos + 1
    if kind == 8:  # binary: a varint length, then the bytes
        length, pos = _read_varint(buf, pos)
        return pos + length
    if kind == _STRUCT:
        return _skip_struct(buf, pos)
    if kind in (_LIST, 10):  # list, set
        count, elem, pos = _read_list_header(buf, pos)
        if elem in (1, 2):  # booleans: a byte each
            return pos + count
        for _ in range(count):
            pos = _skip(buf, pos, elem)
        return pos
    if kind == 11:  # map: a varint size, then a byte of key and value types
        count, pos = _read_varint(buf, pos)
        if not count:
            return pos
        types = buf[pos]
        pos += 1
        for _ in range(count):
            pos = _skip(buf, _skip(buf, pos, types >> 4), types & 0x0F)
        return pos
    if kind not in _FIXED_SIZE:
        raise ValueError(f"a Parquet footer with Thrift type {kind}")
    return pos + _FIXED_SIZE[kind]


def _skip_struct(buf: bytes, pos: int) -> int:
    """The position after a struct's stop. Integers, strings and nested structs, most of a footer,
    are skipped here without a call each (a footer of 400 row groups has ~60,000 fields)."""
    while True:
        head = buf[pos]
        pos += 1
        kind = head & 0x0F
        if not kind:
            return pos
        if head < 0x10:  # a long-form field id: a zigzag varint
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
        if 4 <= kind <= 6:  # i16, i32, i64
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind == 8:
            length, pos = _read_varint(buf, pos)
            pos += length
        elif kind == _STRUCT:
            pos = _skip_struct(buf, pos)
        elif kind == _LIST:
            count, elem, pos = _read_list_header(buf, pos)
            if elem == _STRUCT:
                for _ in range(count):
                    pos = _skip_struct(buf, pos)
            elif elem in (1, 2):  # booleans: a byte each
                pos += count
            else:
                for _ in range(count):
                    pos = _skip(buf, pos, elem)
        elif kind > 2:  # booleans are in the type
            pos = _skip(buf, pos, kind)


_PER_GROUP = ("starts", "ends", "rows", "lows", "highs", "last_ts", "nulls")


def bounds_to_arrays(files: dict[str, FileBounds]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Files' bounds (by their path relative to the table) as an index snapshot's meta and arrays, so
    a restart's reads choose row groups without reading a footer first (24-29 ms of CPU a file of
    ~160 groups). The fields every file of a table shares (schema, the footer's other fields) are
    kept once per distinct value."""
    templates: list[dict[str, Any]] = []
    seen: dict[tuple[bytes, int, bytes, tuple[str, ...]], int] = {}
    ids, scalars = [], []
    for bounds in files.values():
        key = (bounds._head, bounds._head_last, bounds._tail, tuple(bounds.optional))
        if key not in seen:
            seen[key] = len(templates)
            templates.append({"head": bounds._head.hex(), "head_last": bounds._head_last, "tail": bounds._tail.hex(),
                              "schema": bounds.schema.serialize().to_pybytes().hex(), "leaves": bounds.leaves,
                              "optional": bounds.optional})
        ids.append(seen[key])
        scalars.append((bounds.footer_at, bounds.size, bounds.parsed_nbytes, len(bounds)))
    meta = {"paths": list(files), "templates": templates, "template_of": ids}
    table = np.array(scalars, np.int64).reshape(-1, 4)
    arrays = {"fb_files": table.reshape(-1)}
    for name in _PER_GROUP:
        parts = [getattr(b, name) for b in files.values()]
        dtype = np.uint8 if name == "nulls" else np.int64
        arrays[f"fb_{name}"] = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
    return meta, arrays


def bounds_from_arrays(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, FileBounds]:
    """`bounds_to_arrays` read back (by relative path); raises KeyError or ValueError when they do not fit."""
    templates = []
    for t in meta["templates"]:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(t["schema"])))
        templates.append((bytes.fromhex(t["head"]), int(t["head_last"]), bytes.fromhex(t["tail"]), schema,
                          {k: list(v) for k, v in t["leaves"].items()}, list(t["optional"])))
    table = arrays["fb_files"].astype(np.int64).reshape(-1, 4)
    paths = meta["paths"]
    if len(table) != len(paths) or len(meta["template_of"]) != len(paths):
        raise ValueError("file bounds of a snapshot do not match their paths")
    ends = np.cumsum(table[:, 3])
    if any(len(arrays[f"fb_{name}"]) != (ends[-1] if len(ends) else 0) for name in _PER_GROUP):
        raise ValueError("file bounds of a snapshot do not match their row groups")
    out: dict[str, FileBounds] = {}
    for i, path in enumerate(paths):
        head, head_last, tail, schema, leaves, optional = templates[meta["template_of"][i]]
        b = FileBounds.__new__(FileBounds)
        b.schema, b._head, b._head_last, b._tail, b.leaves, b.optional = schema, head, head_last, tail, leaves, optional
        b.footer_at, b.size, b.parsed_nbytes = (int(v) for v in table[i, :3])
        b.checked = False
        lo, hi = int(ends[i] - table[i, 3]), int(ends[i])
        for name in _PER_GROUP:
            column = arrays[f"fb_{name}"][lo:hi]
            setattr(b, name, column.astype(np.uint8 if name == "nulls" else np.int64))
        out[path] = b
    return out
