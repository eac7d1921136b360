"""Consumer config records: `_system/consumers/<stream>/<name>.json`, one a consumer, written when it is
added or changed and read when its stream's consumers are restored.

A record holds the config, the consumer's identity and its starting state (a snapshot: the ack table
holds everything after it). On a stream whose subjects are protected the config is sealed: its filters
name subjects, which would otherwise reach the warehouse in clear (engine/store/sealed.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson

from engine.consumer import Consumer
from engine.consumer_config import parse_consumer_config
from engine.store.layout import Layout
from engine.store.objectstore import ObjectNotFoundError

if TYPE_CHECKING:
    from engine.store.sealed import Sealer
    from engine.stream import Stream

log = logging.getLogger(__name__)


def write_record(layout: Layout, consumer: Consumer) -> None:
    """Writes a consumer's record (the caller marks the change for the catalog)."""
    record = {
        **_config_field(consumer.stream, consumer.name, consumer.config.to_json()),
        "name": consumer.name,
        "consumer_id": consumer.consumer_id,
        "created": consumer.created_ns,
        "ephemeral": consumer.ephemeral,
        "start": consumer.state.snapshot(),
    }
    layout.objects.put(layout.consumer_config_key(consumer.stream.name, consumer.name), orjson.dumps(record))


def read_record(layout: Layout, key: str) -> dict[str, Any] | None:
    """A record, or None when its file is gone: the catalog named it, its file is the truth (removed since)."""
    try:
        record: dict[str, Any] = orjson.loads(layout.objects.get(key).data)
    except ObjectNotFoundError:
        log.warning("consumer config %s is gone: not restored", key)
        return None
    return record


def consumer_of(stream: Stream, record: dict[str, Any]) -> Consumer:
    """The consumer a record describes, in the state of a new one (its history is restored after)."""
    config = parse_consumer_config(_config_json(stream, record))
    return Consumer(stream, config, record["name"], record["consumer_id"], record["created"], record["ephemeral"])


def record_keys(layout: Layout, under: str | None = None) -> dict[str, list[str]]:
    """Every consumer record of the account (or `under` one stream's folder) by its stream's folder key,
    in name order: one listing of the store (a restart of many streams asks once, not once per stream)."""
    found: dict[str, list[str]] = {}
    for meta in layout.objects.list(under or layout.consumer_configs_root_key):
        folder, _, name = meta.key.rpartition("/")
        if name.endswith(".json"):
            found.setdefault(folder, []).append(meta.key)
    return found


def _protecting_sealer(stream: Stream) -> Sealer | None:
    sealer: Sealer | None = getattr(stream.store, "sealer", None)
    return sealer if sealer is not None and sealer.protected else None


def _config_field(stream: Stream, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A consumer's config for its record: sealed on a stream whose subjects are protected."""
    sealer = _protecting_sealer(stream)
    if sealer is None:
        return {"config": config}
    return {"config_sealed": sealer.seal_config(f"consumer:{name}", config)}


def _config_json(stream: Stream, record: dict[str, Any]) -> Any:
    if "config_sealed" not in record:
        return record["config"]
    sealer = _protecting_sealer(stream)
    if sealer is None:
        raise RuntimeError(f"consumer {record['name']} of stream {stream.name} has a sealed config and the "
                           "stream has no key")
    return sealer.open_config(f"consumer:{record['name']}", record["config_sealed"])
