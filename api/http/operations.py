"""Every HTTP route and the NATS operation it stands for: the one declaration the permission check reads.

A route needs publish permission on the `$JS.API.…` subject nats-server's JetStream API uses for the
same call (nats-security.md §3), on the message subject for a publish, on `$JS.ACK.<stream>.<consumer>.>`
for acks, and on what nats.go's KV and object store publish for the same call, so that a permissions
block written for nats-server means the same here. Each `Route` lists `grants`: all are needed; a
grant is satisfied by any one of its subject templates (nats.go reads a KV value with
`$JS.API.DIRECT.GET.…` or `$JS.API.STREAM.MSG.GET.…`, whichever the user may use).

Templates take `{param}` from the path, the query string (with the route's defaults) or, for a
value only the body holds (a stream's name on create, a batch's subjects), from the route handler
(`needs`), which then calls the check itself before it may touch the engine (api/http/deps.py). `{.x}`
appends `.value` when x is set; a template naming a param that is None does not apply to that
request; `{x|b64}` is base64url (an object's name in `$O.<bucket>.M.<name>`). The token `*` inside a
checked subject stands for a name the client does not choose (an ordered consumer's, a chunk's nuid):
only a wildcard grant covers it, as a random name would be. The gateway's own routes with no JetStream
counterpart are mapped to the nearest operation and named `(JetLake)` below.

api/http/fast_paths.py dispatches the hot routes from this same table, and FastAPI's routes are checked
against it by a test, so a route cannot exist in one and differ in another.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl

from starlette.routing import compile_path

Params = Mapping[str, Any]
_PLACEHOLDER = re.compile(r"\{(\.?)(\w+)(?:\|(\w+))?\}")

INFO = "$JS.API.INFO"


def _reads(grant: tuple[str, ...]) -> set[str]:
    """The params a grant's templates read."""
    return {m.group(2) for t in grant for m in _PLACEHOLDER.finditer(t)}

ANY = "*"  # a name chosen by the server or at random: only a wildcard grant covers it


@dataclass(frozen=True)
class Route:
    """One route: what it is, and the publish subjects its caller needs."""

    name: str
    method: str
    path: str
    grants: tuple[tuple[str, ...], ...] = ()
    needs: frozenset[str] = frozenset()  # params only the handler knows (from the body)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    open: bool = False  # no authentication (health)
    system: bool = False  # the system account's route; `{account}` names the account it acts on
    removed: bool = False  # a system route on an account no longer in the config (its deletion)
    jetstream: bool = True  # needs the account's JetStream (10039 when off)
    many: str | None = None  # a param the handler gives as a list: each value is checked (a batch's subjects)
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    early: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)  # checked by the gate
    late: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)  # checked by the handler
    early_params: tuple[str, ...] = field(init=False, repr=False, compare=False)  # what the early grants read

    def __post_init__(self) -> None:
        regex, _, convertors = compile_path(self.path)
        object.__setattr__(self, "regex", regex)
        late = tuple(g for g in self.grants if _reads(g) & self.needs)
        object.__setattr__(self, "late", late)
        object.__setattr__(self, "early", tuple(g for g in self.grants if g not in late))
        reads = set().union(*(_reads(g) for g in self.early))
        if self.derive is not None:  # a derived value may read any path or query parameter
            reads |= set(convertors) | set(self.defaults)
        object.__setattr__(self, "early_params", tuple(sorted(reads)))

    @property
    def deferred(self) -> bool:
        return bool(self.needs)


def _any(*templates: str) -> tuple[str, ...]:
    return templates


def _msg_get(stream: str, direct_subject: str = "") -> tuple[str, ...]:
    """A message read: MSG.GET, or DIRECT.GET (with the subject when nats.go appends it)."""
    return _any(f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}{direct_subject}")


def _ordered_consumer(stream: str, filter_: str) -> tuple[str, ...]:
    """What nats.go's watchers, key lists and object reads create: an ordered consumer named at random."""
    return _any(f"$JS.API.CONSUMER.CREATE.{stream}.{ANY}.{filter_}")


def _object_meta(p: dict[str, Any]) -> dict[str, Any]:
    return {"meta": base64.urlsafe_b64encode(str(p["name"]).encode()).decode()}


def _kv_read(p: dict[str, Any]) -> dict[str, Any]:
    return {"direct": "" if p.get("revision") is not None else f".$KV.{p['bucket']}.{p['key']}"}


_CONSUMER_CREATE = (
    "$JS.API.CONSUMER.CREATE.{stream}.{consumer}{.filter}",
    "$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
    "$JS.API.CONSUMER.CREATE.{stream}{unnamed}",
)

ROUTES: tuple[Route, ...] = (
    # health, metrics, account
    Route("health", "GET", "/healthz", open=True, jetstream=False),
    Route("metrics", "GET", "/metrics", ((INFO,),), jetstream=False),  # (JetLake) the caller's account only
    Route("info", "GET", "/v1/info", ((INFO,),)),
    Route("flush", "POST", "/v1/flush", ((INFO,),), jetstream=False),  # (JetLake) commits the caller's account
    Route("cluster", "GET", "/v1/cluster", ((INFO,),), jetstream=False),  # (JetLake) the gateways serving the warehouse
    # streams
    Route("streams.create", "POST", "/v1/streams", (("$JS.API.STREAM.CREATE.{stream}",),), frozenset({"stream"})),
    Route("streams.list", "GET", "/v1/streams", (("$JS.API.STREAM.LIST",),)),
    Route("streams.info", "GET", "/v1/streams/{stream}", (("$JS.API.STREAM.INFO.{stream}",),)),
    Route("streams.update", "PUT", "/v1/streams/{stream}", (("$JS.API.STREAM.UPDATE.{stream}",),)),
    Route("streams.delete", "DELETE", "/v1/streams/{stream}", (("$JS.API.STREAM.DELETE.{stream}",),)),
    Route("streams.purge", "POST", "/v1/streams/{stream}/purge", (("$JS.API.STREAM.PURGE.{stream}",),)),
    Route("messages.get", "GET", "/v1/streams/{stream}/messages/{seq}", (_msg_get("{stream}"),)),
    Route("messages.find", "GET", "/v1/streams/{stream}/messages", (_msg_get("{stream}", "{.last_by_subj}"),),
          defaults={"last_by_subj": None}),
    Route("messages.delete", "DELETE", "/v1/streams/{stream}/messages/{seq}", (("$JS.API.STREAM.MSG.DELETE.{stream}",),)),
    # publish
    Route("publish.raw", "POST", "/v1/publish/{subject:path}", (("{subject}",),)),
    Route("publish.batch", "POST", "/v1/publish", (("{subject}",),), frozenset({"subject"}), many="subject"),
    # consumers
    Route("consumers.create", "POST", "/v1/streams/{stream}/consumers", (_CONSUMER_CREATE,),
          frozenset({"consumer", "durable", "unnamed", "filter"})),
    Route("consumers.list", "GET", "/v1/streams/{stream}/consumers", (("$JS.API.CONSUMER.LIST.{stream}",),)),
    Route("consumers.info", "GET", "/v1/streams/{stream}/consumers/{consumer}", (("$JS.API.CONSUMER.INFO.{stream}.{consumer}",),)),
    Route("consumers.update", "PUT", "/v1/streams/{stream}/consumers/{consumer}", (_CONSUMER_CREATE,),
          frozenset({"durable", "unnamed", "filter"})),
    Route("consumers.delete", "DELETE", "/v1/streams/{stream}/consumers/{consumer}",
          (("$JS.API.CONSUMER.DELETE.{stream}.{consumer}",),)),
    Route("consumers.next", "POST", "/v1/streams/{stream}/consumers/{consumer}/next",
          (("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",),)),
    Route("consumers.unpin", "POST", "/v1/streams/{stream}/consumers/{consumer}/unpin",
          (("$JS.API.CONSUMER.UNPIN.{stream}.{consumer}",),)),
    Route("consumers.ack", "POST", "/v1/streams/{stream}/consumers/{consumer}/ack", (("$JS.ACK.{stream}.{consumer}.>",),)),
    Route("consumers.consume", "GET", "/v1/streams/{stream}/consumers/{consumer}/messages",
          (("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",),)),
    # key/value buckets: streams KV_<bucket> on $KV.<bucket>.<key>
    Route("kv.create", "POST", "/v1/kv", (("$JS.API.STREAM.CREATE.KV_{bucket}",),), frozenset({"bucket"})),
    Route("kv.list", "GET", "/v1/kv", (("$JS.API.STREAM.LIST",),)),
    Route("kv.status", "GET", "/v1/kv/{bucket}", (("$JS.API.STREAM.INFO.KV_{bucket}",),)),
    Route("kv.destroy", "DELETE", "/v1/kv/{bucket}", (("$JS.API.STREAM.DELETE.KV_{bucket}",),)),
    Route("kv.put", "PUT", "/v1/kv/{bucket}/entries/{key:path}", (("$KV.{bucket}.{key}",),)),
    Route("kv.get", "GET", "/v1/kv/{bucket}/entries/{key:path}", (_msg_get("KV_{bucket}", "{direct}"),),
          defaults={"revision": None}, derive=_kv_read),
    Route("kv.delete", "DELETE", "/v1/kv/{bucket}/entries/{key:path}", (("$KV.{bucket}.{key}",),)),
    Route("kv.history", "GET", "/v1/kv/{bucket}/history/{key:path}", (_ordered_consumer("KV_{bucket}", "$KV.{bucket}.{key}"),)),
    Route("kv.keys", "GET", "/v1/kv/{bucket}/keys", (_ordered_consumer("KV_{bucket}", "$KV.{bucket}.{filter}"),),
          defaults={"filter": ">"}),
    Route("kv.watch", "GET", "/v1/kv/{bucket}/watch", (_ordered_consumer("KV_{bucket}", "$KV.{bucket}.{key}"),),
          defaults={"key": ">"}),
    # object stores: streams OBJ_<bucket> on $O.<bucket>.C.<nuid> (chunks) and $O.<bucket>.M.<name> (infos)
    Route("objects.create", "POST", "/v1/objects", (("$JS.API.STREAM.CREATE.OBJ_{bucket}",),), frozenset({"bucket"})),
    Route("objects.list", "GET", "/v1/objects", (("$JS.API.STREAM.LIST",),)),
    Route("objects.status", "GET", "/v1/objects/{bucket}", (("$JS.API.STREAM.INFO.OBJ_{bucket}",),)),
    Route("objects.destroy", "DELETE", "/v1/objects/{bucket}", (("$JS.API.STREAM.DELETE.OBJ_{bucket}",),)),
    Route("objects.seal", "POST", "/v1/objects/{bucket}/seal",
          (("$JS.API.STREAM.INFO.OBJ_{bucket}",), ("$JS.API.STREAM.UPDATE.OBJ_{bucket}",))),
    Route("objects.list_objects", "GET", "/v1/objects/{bucket}/list", (_ordered_consumer("OBJ_{bucket}", "$O.{bucket}.M.>"),)),
    Route("objects.watch", "GET", "/v1/objects/{bucket}/watch", (_ordered_consumer("OBJ_{bucket}", "$O.{bucket}.M.>"),)),
    Route("objects.info", "GET", "/v1/objects/{bucket}/info/{name:path}", (_msg_get("OBJ_{bucket}", ".$O.{bucket}.M.{meta}"),),
          derive=_object_meta),
    Route("objects.put", "PUT", "/v1/objects/{bucket}/data/{name:path}",
          (_msg_get("OBJ_{bucket}", ".$O.{bucket}.M.{meta}"), (f"$O.{{bucket}}.C.{ANY}",), ("$O.{bucket}.M.{meta}",)),
          derive=_object_meta),
    Route("objects.get", "GET", "/v1/objects/{bucket}/data/{name:path}",
          (_msg_get("OBJ_{bucket}", ".$O.{bucket}.M.{meta}"), _ordered_consumer("OBJ_{bucket}", f"$O.{{bucket}}.C.{ANY}")),
          derive=_object_meta),
    Route("objects.delete", "DELETE", "/v1/objects/{bucket}/data/{name:path}",
          (_msg_get("OBJ_{bucket}", ".$O.{bucket}.M.{meta}"), ("$O.{bucket}.M.{meta}",), ("$JS.API.STREAM.PURGE.OBJ_{bucket}",)),
          derive=_object_meta),
    # GDPR erasure (JetLake): a seq as a message delete, a filter as a purge of the stream
    Route("erasures.create", "POST", "/v1/erasures",
          (("$JS.API.STREAM.MSG.DELETE.{stream}{by_seq}", "$JS.API.STREAM.PURGE.{stream}{by_filter}"),),
          frozenset({"stream", "by_seq", "by_filter"})),
    Route("erasures.status", "GET", "/v1/erasures/{erasure_id}", (("$JS.API.STREAM.INFO.{stream}",),), frozenset({"stream"})),
    # the system account's routes (JetLake): account listing, usage, erasure and key rotation in any account
    Route("accounts.list", "GET", "/v1/accounts", (("$SYS.REQ.SERVER.PING.ACCOUNTZ",),), system=True, jetstream=False),
    Route("accounts.info", "GET", "/v1/accounts/{account}", (("$SYS.REQ.ACCOUNT.{account}.JSZ",),), system=True),
    Route("accounts.erase", "POST", "/v1/accounts/{account}/erasures", (("$SYS.REQ.ACCOUNT.{account}.ERASE",),), system=True),
    Route("accounts.erasure", "GET", "/v1/accounts/{account}/erasures/{erasure_id}",
          (("$SYS.REQ.ACCOUNT.{account}.JSZ",),), system=True),
    Route("accounts.rotate_key", "POST", "/v1/accounts/{account}/streams/{stream}/rotate-key",
          (("$SYS.REQ.ACCOUNT.{account}.KEY.ROTATE.{stream}",),), system=True),
    # deleting an account that left the config: nats-server's account purge (system account only)
    Route("accounts.delete", "DELETE", "/v1/accounts/{account}", (("$JS.API.ACCOUNT.PURGE.{account}",),),
          system=True, jetstream=False, removed=True),
)

BY_NAME = {route.name: route for route in ROUTES}
_BY_METHOD: dict[str, list[Route]] = {}
for _route in ROUTES:
    _BY_METHOD.setdefault(_route.method, []).append(_route)


def match(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route a request goes to and its path parameters, exactly as Starlette's router matches them."""
    for route in _BY_METHOD.get(method, ()):
        found = route.regex.match(path)
        if found is not None:
            return route, found.groupdict()
    return None


def request_params(route: Route, path_params: Mapping[str, str], query_string: bytes) -> dict[str, Any]:
    """The values the route's templates read: path parameters, then query parameters over defaults."""
    params: dict[str, Any] = dict(route.defaults)
    if query_string:
        try:
            for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
                if key in params:
                    params[key] = value
        except ValueError:
            pass
    params.update(path_params)
    return params


def subjects(route: Route, params: Mapping[str, Any], grant: tuple[str, ...]) -> list[str]:
    """The subjects of one grant's templates that apply to these params (any one of them suffices)."""
    values = params
    if route.derive is not None:
        values = {**params, **route.derive(dict(params))}
    if len(grant) == 1:
        subject = _fill(grant[0], values)
        return [] if subject is None else [subject]
    return [s for s in (_fill(t, values) for t in grant) if s is not None]


Part = tuple[str, str, bool, str | None]  # literal text, then a param: name, whether dotted, conversion


@lru_cache(maxsize=None)
def _parts(template: str) -> tuple[Part, ...]:
    parts: list[Part] = []
    pos = 0
    for found in _PLACEHOLDER.finditer(template):
        dot, name, conversion = found.groups()
        parts.append((template[pos : found.start()], name, bool(dot), conversion))
        pos = found.end()
    parts.append((template[pos:], "", False, None))
    return tuple(parts)


def _fill(template: str, values: Mapping[str, Any]) -> str | None:
    """The template with its params; None if a param it needs (not a `{.x}` one) is None."""
    parts = _parts(template)
    if len(parts) == 2 and not parts[0][0] and not parts[1][0] and not parts[0][2] and parts[0][3] is None:
        value = values.get(parts[0][1])  # a template that is one param (a publish's subject)
        return None if value is None else str(value)
    out = []
    for literal, name, dot, conversion in parts:
        out.append(literal)
        if not name:
            continue
        value = values.get(name)
        if value is None:
            if not dot:
                return None
            continue
        text = str(value)
        if conversion == "b64":
            text = base64.urlsafe_b64encode(text.encode()).decode()
        out.append("." + text if dot else text)
    return "".join(out)

