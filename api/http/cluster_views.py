"""Account-wide views with several gateways: every stream of the account, whichever gateway owns it.

Each gateway serves the streams it owns (engine/cluster/ownership.py), so its engine alone would list
only those. A view of the whole account (`GET /v1/streams` with its paging, `/v1/info`, the KV and
object bucket lists, the system account's `/v1/accounts[/{account}]`) is answered by asking this
gateway's own app and every other live gateway (the same request, marked forwarded so each answers
for itself only, each bounded by PEER_TIMEOUT, all at once) and merging the answers:
- the stored configs in the warehouse are the truth for which streams exist: a stream whose owner
  did not answer (dead, not yet taken over, slower than the bound) or that nobody owns yet is listed
  under `missing`, as nats-server lists the streams it could not get info for, and still counted in
  the account's `streams`;
- states come from the owners (a stream is listed once, from the first answer holding it);
- usage (memory, storage, reservations, consumers, API counters) is the sum over the answers; the
  account's limits are this gateway's (every gateway reads the same account config).
Paging (`offset`, `limit`) is applied to the merged list, sorted by name as one gateway sorts it.
Counterpart: nats-server's meta leader answering `$JS.API.STREAM.LIST` and `$JS.API.INFO` from the
cluster's assignments, with `missing` for streams whose leader did not answer in time.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.gate import ROUTE
from api.http.peers import Answer, Ask, Locator, capture
from api.http.responses import json_response
from engine.subjects import subjects_collide

VIEWS = frozenset({"streams.list", "info", "kv.list", "objects.list", "accounts.info", "accounts.list"})
PEER_TIMEOUT = 2.0
_EVERYTHING = 1_000_000_000
_SUMMED = ("memory", "storage", "reserved_memory", "reserved_storage", "consumers")


async def answer(app: ASGIApp, locator: Locator, ask: Ask, account: str, scope: Scope,
                 receive: Receive, send: Send) -> None:
    """Answers an account-wide route (one of VIEWS) for every gateway's streams."""
    route = scope[ROUTE][0].name
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    paging = _paging(query) if route == "streams.list" else (0, 0)
    if paging is None:  # bad paging: this gateway answers the error as one gateway would
        await app(scope, receive, send)
        return
    if route == "streams.list":
        query.update(offset="0", limit=str(_EVERYTHING))
    whole = dict(scope, query_string=urlencode(query).encode("latin-1"))
    local = await capture(app, whole, b"", receive)
    if local.status != 200:
        await _relay(local, scope, receive, send)
        return
    peers = await asyncio.to_thread(locator.peers)
    remote = await asyncio.gather(*(ask(whole, b"", url, PEER_TIMEOUT) for url in peers))
    answers = [orjson.loads(a.body) for a in [local, *remote] if a is not None and a.status == 200]
    if route == "streams.list":
        merged = merge_stream_lists(answers, await asyncio.to_thread(locator.stream_subjects, account),
                                    query.get("subject"), *paging)
    elif route == "info":
        merged = merge_info(answers, len(await asyncio.to_thread(locator.stream_subjects, account)))
    elif route in ("kv.list", "objects.list"):
        merged = merge_buckets(answers)
    elif route == "accounts.info":
        merged = await _merge_summaries(locator, answers)
    else:
        merged = {"accounts": [await _merge_summaries(locator, same) for same in _by_account(answers)]}
        merged = {"total": len(merged["accounts"]), **merged}
    await json_response(merged, 200)(scope, receive, send)


def merge_stream_lists(answers: list[dict[str, Any]], configs: list[tuple[str, list[str]]], subject: str | None,
                       offset: int, limit: int) -> dict[str, Any]:
    """One `STREAM.LIST` page from every gateway's whole list and the stored configs."""
    found: dict[str, Any] = {}
    missing: set[str] = set()
    for one in answers:
        for info in one.get("streams", []):
            found.setdefault(info["config"]["name"], info)
        missing.update(one.get("missing", []))
    for name, subjects in configs:
        if subject is None or any(subjects_collide(subject, s) for s in subjects):
            missing.add(name)
    missing -= found.keys()
    streams = [found[name] for name in sorted(found)]
    out: dict[str, Any] = {"total": len(streams), "offset": offset, "limit": limit,
                           "streams": streams[offset : offset + limit]}
    if missing:
        out["missing"] = sorted(missing)
    return out


def merge_info(infos: list[dict[str, Any]], streams: int) -> dict[str, Any]:
    """The account's usage over every gateway; `streams` counts the stored configs."""
    out = dict(infos[0])
    for key in _SUMMED:
        if key in out:
            out[key] = sum(int(i.get(key, 0)) for i in infos)
    out["streams"] = max(streams, sum(int(i.get("streams", 0)) for i in infos))
    if isinstance(out.get("api"), dict):
        out["api"] = dict(out["api"], total=sum(i.get("api", {}).get("total", 0) for i in infos),
                          errors=sum(i.get("api", {}).get("errors", 0) for i in infos))
    return out


def merge_buckets(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Every KV (or object) bucket, once, by name."""
    found: dict[str, Any] = {}
    for one in answers:
        for status in one.get("buckets", []):
            found.setdefault(status["bucket"], status)
    return {"total": len(found), "buckets": [found[name] for name in sorted(found)]}


async def _merge_summaries(locator: Locator, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One account's summary (the system account's view) over every gateway."""
    out = dict(summaries[0])
    infos = [s["info"] for s in summaries if isinstance(s.get("info"), dict)]
    if infos:
        streams = len(await asyncio.to_thread(locator.stream_subjects, out["name"]))
        out["info"] = merge_info(infos, streams)
    return out


def _by_account(answers: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for one in answers:
        for summary in one.get("accounts", []):
            grouped.setdefault(summary["name"], []).append(summary)
    return [grouped[name] for name in sorted(grouped)]


def _paging(query: dict[str, str]) -> tuple[int, int] | None:
    try:
        offset, limit = int(query.get("offset", "0")), int(query.get("limit", "256"))
    except ValueError:
        return None
    return (offset, limit) if offset >= 0 and limit > 0 else None


async def _relay(answer: Answer, scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer.body)).encode())]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
