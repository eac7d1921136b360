"""The residue scanner of the erasure tests: every place under a folder where a marker still shows."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote

import pyarrow as pa
import pyarrow.parquet as pq


def needles_for(marker: str, *texts: str) -> dict[str, bytes]:
    """The marker as bytes and in the encodings a file or folder name or a log entry could use."""
    forms = {marker: marker.encode(), f"{marker} utf-16": marker.encode("utf-16-le")}
    for text in (marker, *texts):
        forms[f"quote({text})"] = quote(text, safe="").encode()
        forms[f"quote_plus({text})"] = quote_plus(text).encode()
        forms[f"base64({text})"] = base64.b64encode(text.encode()).decode().rstrip("=").encode()
        forms[f"urlsafe_base64({text})"] = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=").encode()
    return forms


def find_residue(root: Path, needles: dict[str, bytes], attempts: int = 5) -> list[str]:
    """Every place under `root` where a needle shows: names, raw bytes (path and offset), and the
    decoded values of Parquet files (compression could hide a repeated marker from a byte search).
    Every file is read: table data, `_delta_log` and checkpoints, `_wal`, `_system`.

    A running gateway renames its temporary files into place (a lease, a log entry) while the scan
    walks; a file gone between its listing and its reading may have moved to a name already passed,
    so the scan starts again rather than skip it."""
    for _ in range(attempts - 1):
        try:
            return _scan(root, needles)
        except FileNotFoundError:
            continue
    return _scan(root, needles)


def _scan(root: Path, needles: dict[str, bytes]) -> list[str]:
    hits: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        for name in dirnames:
            hits += _name_hits(str(Path(dirpath) / name), name, needles)
        for name in filenames:
            path = Path(dirpath) / name
            hits += _name_hits(str(path), name, needles)
            hits += _content_hits(str(path), name, path.read_bytes(), needles)
    return hits


def _raise(error: OSError) -> None:
    """os.walk would pass over a folder it cannot list; a scan for residue must not."""
    raise error


def find_residue_in_objects(objects: Iterable[tuple[str, bytes]], needles: dict[str, bytes]) -> list[str]:
    """The same search over objects of a bucket, given as (key, bytes): every segment of each key (its
    "folders" too), the raw bytes, and the decoded values of Parquet objects."""
    hits: list[str] = []
    for key, data in objects:
        for segment in key.split("/"):
            hits += _name_hits(key, segment, needles)
        hits += _content_hits(key, key.rsplit("/", 1)[-1], data, needles)
    return hits


def _name_hits(where: str, name: str, needles: dict[str, bytes]) -> list[str]:
    hits = []
    for label, needle in needles.items():
        text = needle.decode(errors="ignore")
        if text and (text in name or text in unquote(name)):
            hits.append(f"name {where} ({label})")
    return hits


def _content_hits(where: str, name: str, data: bytes, needles: dict[str, bytes]) -> list[str]:
    hits = []
    for label, needle in needles.items():
        for m in re.finditer(re.escape(needle), data):
            hits.append(f"bytes {where} offset {m.start()} ({label})")
    if name.endswith(".parquet") and not name.startswith("."):
        try:
            values = repr(pq.read_table(pa.BufferReader(data)).to_pylist()).encode()
        except Exception as exc:  # a file we cannot decode is itself worth reporting
            return [*hits, f"undecodable parquet {where}: {exc}"]
        for label, needle in needles.items():
            if needle in values:
                hits.append(f"decoded parquet {where} ({label})")
    return hits
