"""The fast-path dispatcher answers only the routes it knows, exactly as their FastAPI endpoints."""

from __future__ import annotations

from api.http.fast_paths import _match
from api.http.routes import consumers, kv, publish, streams, system


def _scope(method: str, path: str, query: bytes = b"") -> dict[str, object]:
    return {"type": "http", "method": method, "path": path, "query_string": query}


def test_hot_routes_go_to_their_endpoints_with_their_path_parameters() -> None:
    assert _match(_scope("POST", "/v1/publish/orders.eu")) == (publish.publish_raw, {"subject": "orders.eu"})
    assert _match(_scope("POST", "/v1/publish")) == (publish.publish_batch, {})
    assert _match(_scope("POST", "/v1/streams/S/consumers/C/next")) == (consumers.next_messages, {"stream": "S", "consumer": "C"})
    assert _match(_scope("POST", "/v1/streams/S/consumers/C/ack")) == (consumers.ack, {"stream": "S", "consumer": "C"})
    assert _match(_scope("GET", "/v1/kv/b/entries/a/b.c")) == (kv.get, {"bucket": "b", "key": "a/b.c", "revision": None})
    assert _match(_scope("PUT", "/v1/kv/b/entries/k")) == (kv.put, {"bucket": "b", "key": "k"})
    assert _match(_scope("GET", "/healthz")) == (system.healthz, {})


def test_a_last_by_subject_read_takes_its_one_query_parameter_as_starlette_decodes_it() -> None:
    defaults = {"next_by_subj": None, "seq": 0, "start_time": None}
    assert _match(_scope("GET", "/v1/streams/S/messages", b"last_by_subj=orders.eu")) == (
        streams.find_message, {"stream": "S", "last_by_subj": "orders.eu", **defaults})
    assert _match(_scope("GET", "/v1/streams/S/messages", b"last_by_subj=orders.a%20b+c%3E")) == (
        streams.find_message, {"stream": "S", "last_by_subj": "orders.a b c>", **defaults})
    assert _match(_scope("GET", "/v1/streams/S/messages")) == (streams.find_message, {"stream": "S", "last_by_subj": None, **defaults})


def test_everything_else_is_left_to_fastapi() -> None:
    assert _match(_scope("GET", "/v1/kv/b/entries/k", b"revision=3")) is None  # a query to parse
    for query in (b"last_by_subj=a&seq=1", b"next_by_subj=a&seq=2", b"start_time=x", b"last_by_subj=",
                  b"last_by_subj=a&last_by_subj=b", b"seq=1"):  # other parameters, empty or repeated values
        assert _match(_scope("GET", "/v1/streams/S/messages", query)) is None, query
    assert _match(_scope("POST", "/v1/publish/a\n")) is None  # FastAPI's own answer to such a path
    assert _match(_scope("POST", "/v1/publish/")) is None
    assert _match(_scope("DELETE", "/v1/kv/b/entries/k")) is None
    assert _match(_scope("GET", "/v1/streams/S/consumers/C/next")) is None
    assert _match(_scope("POST", "/v1/streams/S/x/consumers/C/next")) is None
    assert _match({"type": "lifespan"}) is None
