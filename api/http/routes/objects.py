"""Object stores over HTTP: nats.go's ObjectStore API as routes, bodies streamed both ways."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.http import deps
from api.http.body import json_object
from api.http.responses import json_response
from api.http.sse import watch_response
from engine import errors
from engine.objects import DEFAULT_CHUNK_SIZE, ObjectInfo, ObjectWriter, digest_of, damaged

router = APIRouter(prefix="/v1/objects")
log = logging.getLogger(__name__)

WRITE_BATCH_BYTES = 4 * 1024 * 1024  # body bytes handed to the engine per thread hop


@router.post("")
async def create_bucket(request: Request) -> Response:
    body = await json_object(request)
    engine = deps.authorize(request, bucket=deps.text(body.get("bucket")))
    status, created = await run_in_threadpool(engine.objects.create, body)
    return json_response(status, 201 if created else 200)


@router.get("")
def list_buckets(request: Request) -> Response:
    return json_response(deps.engine(request).objects.list())


@router.get("/{bucket}")
def bucket_status(request: Request, bucket: str) -> Response:
    return json_response(deps.engine(request).objects.status(bucket))


@router.delete("/{bucket}")
def destroy_bucket(request: Request, bucket: str) -> Response:
    deps.engine(request).objects.destroy(bucket)
    return json_response({"success": True})


@router.post("/{bucket}/seal")
def seal(request: Request, bucket: str) -> Response:
    return json_response(deps.engine(request).objects.seal(bucket))


@router.get("/{bucket}/list")
def list_objects(request: Request, bucket: str) -> Response:
    return json_response({"objects": [i.to_json() for i in deps.engine(request).objects.list_objects(bucket)]})


@router.get("/{bucket}/watch")
async def watch(request: Request, bucket: str, include_history: bool = False, ignore_deletes: bool = False, updates_only: bool = False) -> Response:
    watcher = deps.engine(request).objects.watch(bucket, include_history, ignore_deletes, updates_only)
    return watch_response(request, watcher, ObjectInfo.to_json)


@router.get("/{bucket}/info/{name:path}")
def info(request: Request, bucket: str, name: str) -> Response:
    return json_response(deps.engine(request).objects.info(bucket, name).to_json())


@router.delete("/{bucket}/data/{name:path}")
def delete(request: Request, bucket: str, name: str) -> Response:
    return json_response(deps.engine(request).objects.delete(bucket, name).to_json())


def _declared(request: Request) -> tuple[int | None, str | None]:
    """The body's declared length and digest (`Digest: SHA-256=...`), each checked once it has arrived."""
    length = request.headers.get("content-length")
    if length is not None and not length.isdigit():
        raise errors.bad_request("invalid Content-Length")
    digest = request.headers.get("digest")
    if digest is not None and not digest.startswith("SHA-256="):
        raise errors.bad_request("Digest must be SHA-256=<base64url>, JetStream's form")
    return (int(length) if length is not None else None), digest


@router.put("/{bucket}/data/{name:path}")
async def put(request: Request, bucket: str, name: str, chunk_size: int = DEFAULT_CHUNK_SIZE, description: str | None = None) -> Response:
    """Streams the body into chunks as it arrives; the object appears only once all of it is stored."""
    length, digest = _declared(request)
    objects = deps.engine(request).objects
    writer = await run_in_threadpool(objects.writer, bucket, name, chunk_size, description)
    try:
        received = await _write_body(request, writer)
        if length is not None and received != length:
            raise errors.bad_request(f"truncated upload: {received} of {length} bytes arrived")
        info = await run_in_threadpool(writer.finish, digest)
    except ClientDisconnect:
        await run_in_threadpool(writer.abort)
        log.warning("upload of %s/%s ended early; its chunks are purged", bucket, name)
        raise errors.bad_request("truncated upload: the client went away before the end of the body") from None
    except BaseException:
        await run_in_threadpool(writer.abort)
        raise
    return json_response(info.to_json())


async def _write_body(request: Request, writer: ObjectWriter) -> int:
    received = 0
    buffer = bytearray()
    async for piece in request.stream():
        received += len(piece)
        buffer += piece
        if len(buffer) >= WRITE_BATCH_BYTES:
            data, buffer = bytes(buffer), bytearray()
            await run_in_threadpool(writer.write, data)
    if buffer:
        await run_in_threadpool(writer.write, bytes(buffer))
    return received


@router.get("/{bucket}/data/{name:path}")
async def get(request: Request, bucket: str, name: str) -> Response:
    """Streams the chunks back; the last one is held until the digest is verified, so a damaged object
    ends the response short of its Content-Length and the client sees the failure."""
    objects = deps.engine(request).objects
    info = await run_in_threadpool(objects.info, bucket, name)
    seqs = await run_in_threadpool(objects.chunk_seqs, info)
    batches = objects.read_batches(info, seqs)

    async def body() -> AsyncIterator[bytes]:
        sha = hashlib.sha256()
        size = 0
        held: bytes | None = None
        while (batch := await run_in_threadpool(next, batches, None)) is not None:
            for chunk in batch:
                if held is not None:
                    yield held
                sha.update(chunk)
                size += len(chunk)
                held = chunk
        if size != info.size or digest_of(sha) != info.digest:
            log.error("object %s/%s failed verification: %d of %d bytes, digest %s", bucket, name, size, info.size, digest_of(sha))
            raise damaged(name, "size or digest differs from its info")
        if held is not None:
            yield held

    headers = {"Content-Length": str(info.size), "Digest": info.digest, "ETag": f'"{info.nuid}"'}
    return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)
