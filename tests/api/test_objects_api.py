"""Object stores through a real gateway: every route of API.md's "Object stores", errors in ApiError's
shape, streamed bodies both ways (Content-Length and Digest on a GET, a damaged object ending short),
uploads refused or cut short leaving nothing visible, a gateway killed mid-upload, and the SSE watch."""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.store.layout import Layout
from tests.gateway import Gateway

CHUNK = 1024
_numbers = itertools.count(1)


def sha256_digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


def payload(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(f"{seed}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    warehouse: Path = tmp_path_factory.mktemp("objects-api") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", "0.2").start()
    yield gateway
    gateway.stop()


@pytest.fixture
def c(gw: Gateway) -> Iterator[httpx.Client]:
    with gw.client() as client:
        yield client


@pytest.fixture
def bucket(c: httpx.Client) -> str:
    name = f"b{next(_numbers)}"
    assert c.post("/v1/objects", json={"bucket": name}).status_code == 201
    return name


def assert_error(r: httpx.Response, status: int, err_code: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    error = body["error"]
    assert set(error) == {"code", "err_code", "description"}, body
    assert (error["code"], error["err_code"]) == (status, err_code), body
    assert isinstance(error["description"], str) and error["description"]
    return error  # type: ignore[no-any-return]


def chunk_subjects(c: httpx.Client, bucket: str) -> list[str]:
    state = c.get(f"/v1/streams/OBJ_{bucket}", params={"subjects_filter": ">"}).json()["state"]
    return sorted(s for s in state.get("subjects") or {} if s.startswith(f"$O.{bucket}.C."))


def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.05)


# -- buckets ------------------------------------------------------------------------------------


def test_bucket_routes(c: httpx.Client) -> None:
    r = c.post(
        "/v1/objects", json={"bucket": "routes", "description": "d", "ttl": 3_600_000_000_000, "max_bytes": 1 << 30}
    )
    assert r.status_code == 201
    status = r.json()
    assert {
        k: status[k]
        for k in ("bucket", "description", "ttl", "max_bytes", "sealed", "size", "backing_store", "storage")
    } == {
        "bucket": "routes",
        "description": "d",
        "ttl": 3_600_000_000_000,
        "max_bytes": 1 << 30,
        "sealed": False,
        "size": 0,
        "backing_store": "JetStream",
        "storage": "file",
    }
    again = c.post(
        "/v1/objects", json={"bucket": "routes", "description": "d", "ttl": 3_600_000_000_000, "max_bytes": 1 << 30}
    )
    assert again.status_code == 200 and again.json() == status
    assert_error(c.post("/v1/objects", json={"bucket": "routes", "description": "other"}), 400, 10058)

    assert c.get("/v1/objects/routes").json() == status
    assert "routes" in [b["bucket"] for b in c.get("/v1/objects").json()["buckets"]]
    assert c.get("/v1/objects/routes/list").json() == {"objects": []}

    c.put("/v1/objects/routes/data/a", content=b"abc").raise_for_status()
    assert c.get("/v1/objects/routes").json()["size"] > 3
    sealed = c.post("/v1/objects/routes/seal")
    assert sealed.status_code == 200 and sealed.json()["sealed"] is True
    assert c.get("/v1/objects/routes").json()["sealed"] is True
    assert_error(c.put("/v1/objects/routes/data/b", content=b"b"), 400, 10109)
    assert_error(c.delete("/v1/objects/routes/data/a"), 400, 10109)
    assert c.get("/v1/objects/routes/data/a").content == b"abc", "a sealed bucket still reads"

    assert c.delete("/v1/objects/routes").json() == {"success": True}
    assert "routes" not in [b["bucket"] for b in c.get("/v1/objects").json()["buckets"]]
    assert_error(c.get("/v1/objects/routes"), 404, 10059)
    assert_error(c.delete("/v1/objects/routes"), 404, 10059)


@pytest.mark.parametrize("name", ["a.b", "a b", "a*", "a%3Eb", "ü"])
def test_invalid_bucket_names(c: httpx.Client, name: str) -> None:
    assert_error(c.post("/v1/objects", json={"bucket": name}), 400, 10003)
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/seal"),
        ("GET", "/list"),
        ("GET", "/watch"),
        ("GET", "/info/x"),
        ("GET", "/data/x"),
        ("PUT", "/data/x"),
        ("DELETE", "/data/x"),
    ):
        assert_error(c.request(method, f"/v1/objects/{name}{path}"), 400, 10003)


def test_bad_bucket_configs(c: httpx.Client) -> None:
    assert_error(c.post("/v1/objects", json={"bucket": "x", "ttl": -1}), 400, 10052)
    assert "nope" in assert_error(c.post("/v1/objects", json={"bucket": "x", "nope": 1}), 400, 10025)["description"]
    assert_error(c.post("/v1/objects", content=b"{not json"), 400, 10025)
    assert_error(c.post("/v1/objects", content=b"[]"), 400, 10025)
    assert_error(c.get("/v1/objects/x"), 404, 10059)


def test_unknown_bucket_is_404_everywhere(c: httpx.Client) -> None:
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/seal"),
        ("GET", "/list"),
        ("GET", "/watch"),
        ("GET", "/info/x"),
        ("GET", "/data/x"),
        ("PUT", "/data/x"),
        ("DELETE", "/data/x"),
    ):
        assert_error(c.request(method, f"/v1/objects/missing{path}"), 404, 10059)


# -- objects ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 3])
def test_put_get_info_round_trip(c: httpx.Client, bucket: str, size: int) -> None:
    data = payload(size, size)
    r = c.put(f"/v1/objects/{bucket}/data/dir/file.bin", params={"chunk_size": CHUNK}, content=data)
    assert r.status_code == 200, r.text
    info = r.json()
    assert set(info) == {"name", "bucket", "nuid", "size", "mtime", "chunks", "digest", "deleted", "options"}
    assert (info["name"], info["bucket"], info["size"], info["chunks"], info["deleted"]) == (
        "dir/file.bin",
        bucket,
        size,
        -(-size // CHUNK),
        False,
    )
    assert info["digest"] == sha256_digest(data) and info["options"] == {"max_chunk_size": CHUNK}
    assert info["mtime"].endswith("Z")

    got = c.get(f"/v1/objects/{bucket}/data/dir/file.bin")
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-length"] == str(size)
    assert got.headers["digest"] == sha256_digest(data)
    assert got.headers["content-type"] == "application/octet-stream"
    assert c.get(f"/v1/objects/{bucket}/info/dir/file.bin").json() == info
    assert c.get(f"/v1/objects/{bucket}/list").json() == {"objects": [info]}


def test_put_streams_a_chunked_body_with_the_default_chunk_size(c: httpx.Client, bucket: str) -> None:
    data = payload(5 * 1024 * 1024 + 17, 9)

    def pieces() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for i in range(0, len(data), 100_000):
            yield data[i : i + 100_000]

    r = c.put(f"/v1/objects/{bucket}/data/big", content=pieces(), headers={"Digest": sha256_digest(data)})
    assert r.status_code == 200, r.text
    assert (r.json()["size"], r.json()["chunks"]) == (len(data), 41)
    with c.stream("GET", f"/v1/objects/{bucket}/data/big") as got:
        assert got.headers["content-length"] == str(len(data))
        assert b"".join(got.iter_bytes()) == data


def test_overwrite_and_delete(c: httpx.Client, bucket: str) -> None:
    first = c.put(f"/v1/objects/{bucket}/data/o", params={"chunk_size": CHUNK}, content=payload(4 * CHUNK, 1)).json()
    second = c.put(f"/v1/objects/{bucket}/data/o", params={"chunk_size": CHUNK}, content=payload(2 * CHUNK, 2)).json()
    assert second["nuid"] != first["nuid"]
    assert c.get(f"/v1/objects/{bucket}/data/o").content == payload(2 * CHUNK, 2)
    assert chunk_subjects(c, bucket) == [f"$O.{bucket}.C.{second['nuid']}"]

    deleted = c.delete(f"/v1/objects/{bucket}/data/o")
    assert deleted.status_code == 200
    body = deleted.json()
    assert (body["name"], body["deleted"], body["size"], body["chunks"], body["digest"]) == ("o", True, 0, 0, "")
    assert chunk_subjects(c, bucket) == []
    assert c.get(f"/v1/objects/{bucket}/list").json() == {"objects": []}
    assert_error(c.get(f"/v1/objects/{bucket}/data/o"), 404, 10037)
    assert_error(c.get(f"/v1/objects/{bucket}/info/o"), 404, 10037)
    assert c.delete(f"/v1/objects/{bucket}/data/o").json()["deleted"] is True, "deleting again does nothing"
    assert_error(c.delete(f"/v1/objects/{bucket}/data/never"), 404, 10037)


def test_put_errors(c: httpx.Client, bucket: str) -> None:
    url = f"/v1/objects/{bucket}/data/x"
    max_payload = c.get("/v1/info").json()["limits"].get("max_payload", 1024 * 1024)
    for chunk_size in (0, -5, max_payload + 1):
        assert_error(c.put(url, params={"chunk_size": chunk_size}, content=b"x"), 400, 10003)
    assert_error(c.put(url, params={"chunk_size": "abc"}, content=b"x"), 400, 10003)
    assert c.put(url, params={"chunk_size": max_payload}, content=b"x").status_code == 200
    assert_error(c.put(url, content=b"x", headers={"Digest": "MD5=abc"}), 400, 10003)
    assert c.get(f"/v1/objects/{bucket}/data/x").content == b"x", "the refused puts left the object alone"


def test_digest_mismatch_leaves_nothing(c: httpx.Client, bucket: str) -> None:
    data = payload(3 * CHUNK + 5)
    r = c.put(
        f"/v1/objects/{bucket}/data/d",
        params={"chunk_size": CHUNK},
        content=data,
        headers={"Digest": sha256_digest(b"other")},
    )
    assert "digest" in assert_error(r, 400, 10003)["description"]
    assert_error(c.get(f"/v1/objects/{bucket}/info/d"), 404, 10037)
    assert c.get(f"/v1/objects/{bucket}/list").json() == {"objects": []}
    assert chunk_subjects(c, bucket) == []
    ok = c.put(
        f"/v1/objects/{bucket}/data/d",
        params={"chunk_size": CHUNK},
        content=data,
        headers={"Digest": sha256_digest(data)},
    )
    assert ok.status_code == 200 and ok.json()["digest"] == sha256_digest(data)


def test_put_over_the_bucket_limit_is_503_and_leaves_nothing(c: httpx.Client) -> None:
    name = f"b{next(_numbers)}"
    c.post("/v1/objects", json={"bucket": name, "max_bytes": 64 * CHUNK}).raise_for_status()
    assert_error(
        c.put(f"/v1/objects/{name}/data/big", params={"chunk_size": CHUNK}, content=payload(100 * CHUNK)), 503, 10077
    )
    assert c.get(f"/v1/objects/{name}/list").json() == {"objects": []}
    assert chunk_subjects(c, name) == []
    assert (
        c.put(f"/v1/objects/{name}/data/small", params={"chunk_size": CHUNK}, content=payload(10 * CHUNK)).status_code
        == 200
    )


def raw_truncated_put(gw: Gateway, path: str, declared: int, sent: bytes, chunked: bool = False) -> None:
    """Sends a PUT whose body stops short, then closes the socket."""
    head = f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {declared}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.sendall(head.encode())
        s.sendall(f"{len(sent):x}\r\n".encode() + sent + b"\r\n" if chunked else sent)
        time.sleep(0.3)  # let the gateway store what came before the client goes away


@pytest.mark.parametrize("chunked", [False, True])
def test_truncated_upload_leaves_nothing(gw: Gateway, c: httpx.Client, bucket: str, chunked: bool) -> None:
    kept = c.put(f"/v1/objects/{bucket}/data/t", params={"chunk_size": CHUNK}, content=b"before").json()
    before = c.get(f"/v1/streams/OBJ_{bucket}").json()["state"]["last_seq"]
    raw_truncated_put(gw, f"/v1/objects/{bucket}/data/t?chunk_size={CHUNK}", 6_000_000, payload(5_000_000), chunked)
    eventually(
        lambda: chunk_subjects(c, bucket) == [f"$O.{bucket}.C.{kept['nuid']}"], "the cut upload's chunks are purged"
    )
    assert c.get(f"/v1/objects/{bucket}/info/t").json() == kept
    assert c.get(f"/v1/objects/{bucket}/data/t").content == b"before"
    assert c.get(f"/v1/streams/OBJ_{bucket}").json()["state"]["last_seq"] > before + 4000, "chunks had been stored"
    assert [o["name"] for o in c.get(f"/v1/objects/{bucket}/list").json()["objects"]] == ["t"]


def test_missing_chunk_is_a_500_before_any_byte(c: httpx.Client, bucket: str) -> None:
    info = c.put(f"/v1/objects/{bucket}/data/m", params={"chunk_size": CHUNK}, content=payload(3 * CHUNK)).json()
    first = c.get(
        f"/v1/streams/OBJ_{bucket}/messages", params={"next_by_subj": f"$O.{bucket}.C.{info['nuid']}", "seq": 1}
    ).json()
    assert (
        c.delete(
            f"/v1/streams/OBJ_{bucket}/messages/{first['message']['seq']}", params={"no_erase": "true"}
        ).status_code
        == 200
    )
    r = c.get(f"/v1/objects/{bucket}/data/m")
    assert "damaged" in assert_error(r, 500, 10051)["description"]


def test_object_replaced_while_read_ends_the_response_short(c: httpx.Client, bucket: str) -> None:
    size = 40 * 1024 * 1024  # several read batches of the default chunk size
    data = payload(size, 4)
    c.put(f"/v1/objects/{bucket}/data/r", content=data).raise_for_status()
    received = 0
    with pytest.raises(httpx.HTTPError):  # peer closed the connection before the declared length
        with c.stream("GET", f"/v1/objects/{bucket}/data/r") as got:
            assert got.headers["content-length"] == str(size)
            pieces = got.iter_raw(64 * 1024)
            received += len(next(pieces))
            with httpx.Client(base_url=str(c.base_url), timeout=30) as other:
                other.put(f"/v1/objects/{bucket}/data/r", content=b"replacement").raise_for_status()
            for piece in pieces:
                received += len(piece)
    assert received < size
    assert c.get(f"/v1/objects/{bucket}/data/r").content == b"replacement"


# -- watch --------------------------------------------------------------------------------------


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    kind, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and data:
            yield kind, data
            kind, data = "message", ""


def test_watch_route(gw: Gateway, c: httpx.Client, bucket: str) -> None:
    c.put(f"/v1/objects/{bucket}/data/a", content=b"a").raise_for_status()
    c.put(f"/v1/objects/{bucket}/data/b", content=b"bb").raise_for_status()
    c.delete(f"/v1/objects/{bucket}/data/b").raise_for_status()
    with (
        httpx.Client(base_url=gw.url, timeout=30) as watcher,
        watcher.stream("GET", f"/v1/objects/{bucket}/watch") as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
        initial = [next(events), next(events)]
        assert [(k, json.loads(d)["name"], json.loads(d)["deleted"]) for k, d in initial] == [
            ("message", "a", False),
            ("message", "b", True),
        ]
        assert next(events)[0] == "init_done"
        putter = threading.Thread(
            target=lambda: c.put(f"/v1/objects/{bucket}/data/c", content=b"ccc").raise_for_status()
        )
        putter.start()
        kind, data = next(events)
        putter.join()
        live = json.loads(data)
        assert (kind, live["name"], live["size"], live["digest"]) == ("message", "c", 3, sha256_digest(b"ccc"))

    with (
        httpx.Client(base_url=gw.url, timeout=30) as watcher,
        watcher.stream("GET", f"/v1/objects/{bucket}/watch", params={"ignore_deletes": "true"}) as r,
    ):
        events = sse_events(r.iter_lines())
        assert [json.loads(next(events)[1])["name"] for _ in range(2)] == ["a", "c"]
        assert next(events)[0] == "init_done"
    assert_error(
        c.get(f"/v1/objects/{bucket}/watch", params={"include_history": "true", "updates_only": "true"}), 400, 10003
    )


# -- a gateway killed mid-upload ----------------------------------------------------------------


def test_gateway_killed_mid_upload_leaves_no_chunks(gateway: Gateway) -> None:
    with gateway.client() as c:
        c.post("/v1/objects", json={"bucket": "k"}).raise_for_status()
        kept = c.put("/v1/objects/k/data/kept", content=payload(300_000)).json()
        with socket.create_connection(("127.0.0.1", gateway.port)) as s:
            s.sendall(b"PUT /v1/objects/k/data/cut HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
            s.sendall(payload(12_000_000, 5))
            eventually(lambda: len(chunk_subjects(c, "k")) == 2, "the upload's first chunks are stored")
            gateway.kill9()
    gateway.start()
    with gateway.client() as c:
        assert chunk_subjects(c, "k") == [f"$O.k.C.{kept['nuid']}"], "the interrupted put's chunks are swept at start"
        assert [o["name"] for o in c.get("/v1/objects/k/list").json()["objects"]] == ["kept"]
        assert_error(c.get("/v1/objects/k/info/cut"), 404, 10037)
        assert c.get("/v1/objects/k/data/kept").content == payload(300_000)


def _corrupt_one_chunk(warehouse: Path, bucket: str, nuid: str, index: int) -> None:
    """Flips one byte of the object's `index`-th chunk in its Parquet file, which stays a readable file of
    the size the Delta log records (rewritten smaller, then padded between its pages and its footer):
    only the digest can tell."""
    subject = f"$O.{bucket}.C.{nuid}"
    table = Layout(warehouse).stream_table(f"OBJ_{bucket}")
    for path in sorted(p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts):
        rows = pq.read_table(path)
        chunks = [i for i, s in enumerate(rows.column("subject").to_pylist()) if s == subject]
        if not chunks:
            continue
        data = rows.column("data").to_pylist()
        row = chunks[index]
        data[row] = bytes([data[row][0] ^ 0xFF]) + data[row][1:]
        at = rows.schema.get_field_index("data")
        out = io.BytesIO()
        changed = rows.set_column(at, rows.schema.field(at), pa.array(data, rows.schema.field(at).type))
        pq.write_table(
            changed, out, compression="zstd", compression_level=19, write_statistics=False, store_schema=False
        )
        raw, size = out.getvalue(), path.stat().st_size
        assert len(raw) <= size, "the rewritten file must fit the size in the Delta log"
        footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
        path.write_bytes(raw[:footer] + bytes(size - len(raw)) + raw[footer:])
        return
    raise AssertionError(f"no Parquet file holds {subject}")


def text_payload(size: int, name: str) -> bytes:
    """Compressible bytes that differ from one chunk to the next."""
    lines = b"".join(f"{name} line {i:06d}\n".encode() for i in range(size // 10 + 1))
    return lines[:size]


def test_a_corrupted_chunk_ends_the_get_short(gateway: Gateway) -> None:
    """README: a GET is verified by its digest. A chunk altered on disk (still a readable file) makes the
    response end before its Content-Length, without its last chunk; an intact object of the same file
    is served whole, and the gateway keeps serving."""
    data, intact = text_payload(16 * CHUNK, "bad"), text_payload(3 * CHUNK, "good")
    with gateway.client() as c:
        c.post("/v1/objects", json={"bucket": "z"}).raise_for_status()
        info = c.put("/v1/objects/z/data/bad", params={"chunk_size": CHUNK}, content=data).json()
        c.put("/v1/objects/z/data/good", params={"chunk_size": CHUNK}, content=intact).raise_for_status()
    gateway.stop()  # flushes every chunk to the Delta table; the restart reads them from its files
    _corrupt_one_chunk(gateway.warehouse, "z", info["nuid"], 2)
    gateway.start()
    with gateway.client() as c:
        received = b""
        with pytest.raises(httpx.HTTPError):  # the peer closed the connection before the declared length
            with c.stream("GET", "/v1/objects/z/data/bad") as got:
                assert (got.status_code, got.headers["content-length"]) == (200, str(len(data)))
                for piece in got.iter_raw():
                    received += piece
        assert len(received) < len(data) and data.startswith(received[: 2 * CHUNK])
        assert received[2 * CHUNK : 3 * CHUNK] != data[2 * CHUNK : 3 * CHUNK], "the altered chunk was read back"
        assert c.get("/v1/objects/z/data/good").content == intact
        assert c.get("/healthz").status_code == 200
