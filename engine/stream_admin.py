"""An account's streams as the STREAM.* API manages them: create, update, delete, infos and listings,
and the operations on a stream's stored messages (get, delete or erase, purge, key rotation).

A file stream's config record is written to `_system/streams/<name>.json` under the catalog copy's
change mark (engine/catalog_upkeep.py); with several gateways, a stream's lease is claimed to create it
and released once it is deleted. Counterpart: the stream parts of server/jetstream_api.go and
server/stream.go `update`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import orjson

from engine import encryption, errors
from engine.account_usage import AccountUsage
from engine.accounts import limits as account_limits
from engine.catalog import check_overlap, check_page, listed, record_json, stream_key_tokens
from engine.catalog_upkeep import CatalogUpkeep
from engine.clock import Clock
from engine.config import check_stream_config, check_stream_update, parse_stream_config, same_config
from engine.consumers import Consumers
from engine.flusher import Flusher
from engine.info import rfc3339, state_json
from engine.keys import Keyring
from engine.store import failpoints
from engine.store.base import StoredMessage
from engine.store.delta import DeltaStore
from engine.store.layout import Layout
from engine.store.leases import Lease
from engine.stream import SUBJECTS_PAGE, Stream
from engine.stream_factory import StreamFactory
from engine.stream_registry import StreamRegistry, check_available
from engine.subjects import is_valid_subject


class StreamAdmin:
    """Creates, changes, deletes and describes the streams of a registry (see the module docstring).

    `claim_stream` and `release_stream` are set with several gateways (engine/cluster/service.py);
    `notify(name)` ends the waits on a stream that is deleted."""

    def __init__(self, layout: Layout, clock: Clock, registry: StreamRegistry, factory: StreamFactory,
                 consumers: Consumers, flusher: Flusher, catalog_upkeep: CatalogUpkeep, account: AccountUsage,
                 notify: Callable[[str], None], cluster: bool) -> None:
        self._layout = layout
        self._clock = clock
        self.claim_stream: Callable[[str], Lease] | None = None
        self.release_stream: Callable[[str], None] | None = None
        self._registry = registry
        self._factory = factory
        self._consumers = consumers
        self._flusher = flusher
        self._catalog_upkeep = catalog_upkeep
        self._account = account
        self._notify = notify
        self._cluster = cluster

    @property
    def _keyring(self) -> Keyring | None:
        return self._factory.keyring

    def add(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates a stream; returns its info and whether it was created (False: identical exists)."""
        config, pedantic = parse_stream_config(body)
        if config.sealed:
            raise errors.invalid_config("stream configuration for create can not be sealed")
        config = check_stream_config(config, pedantic)
        entries = self._registry.entries
        with self._registry.lock:
            others = [e.shape for n, e in entries.items() if n != config.name]
            account_limits.check_stream(self._account.limits, config, others)
            existing = entries.get(config.name)
            if existing is not None:
                stream = self._registry.opened(existing)
                check_available(stream)
                if same_config(stream.config, config):
                    return self.info_of(stream), False
                raise errors.stream_name_exists()
            check_overlap(entries, config)
            encryption.check_create(config, self._keyring)
            sealed = self._keyring is not None and config.storage != "memory"
            key_tokens = encryption.key_tokens(config) if sealed else None
            protected = encryption.protected_subjects(config)
            lease = self.claim_stream(config.name) if self.claim_stream is not None else None
            try:
                stream = self._factory.new_stream(config, self._clock.now_ns(), uuid.uuid4().hex,
                                                  config.partition_tokens, key_tokens, protected, lease)
                if isinstance(stream.store, DeltaStore):
                    try:
                        stream.store.create()
                    except TimeoutError:
                        raise errors.UnavailableError(
                            f"a maintenance job holds the table of {config.name}; try again") from None
                    self._write_config(stream)
                if lease is not None:
                    self._consumers.open_stream(stream, lease)
            except BaseException:
                if lease is not None and self.release_stream is not None:
                    self.release_stream(config.name)
                raise
            stream.start_at_first_seq()
            self._registry.register(config.name, stream)
            return self.info_of(stream), True

    def update(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        config, pedantic = parse_stream_config(body)
        if "/" in name or "\\" in name:  # only a create answers 10128; an update's name check is checkStreamCfg's
            raise errors.invalid_stream_name()
        if config.name and config.name != name:
            raise errors.stream_mismatch()
        config.name = name
        config = check_stream_config(config, pedantic)
        entries = self._registry.entries
        with self._registry.lock:
            stream = self._registry.stream(name)
            check_stream_update(stream.config, config)
            encryption.check_update(stream.config, config, stream_key_tokens(stream) is not None)
            others = [e.shape for n, e in entries.items() if n != name]
            account_limits.check_stream(self._account.limits, config, others, update=stream.config)
            check_overlap(entries, config, exclude=name)
            old = stream.config
            stream.config = config
            try:
                if isinstance(stream.store, DeltaStore):
                    self._write_config(stream)
            except BaseException:
                stream.config = old
                raise
            stream.apply_config(config)
            self._registry.rerouted(name)
            return self.info_of(stream)

    def delete(self, name: str) -> None:
        entry = self._registry.entries.get(name)
        if entry is None:
            raise errors.StreamNotFoundError()
        self._registry.opened(entry)  # its consumers' rows and its key go with it
        # Lock order everywhere: the flush lock before the registry lock (flush() takes both).
        with self._flusher.lock, self._registry.lock:
            entry = self._registry.entries.get(name)
            if entry is None or entry.stream is None:
                raise errors.StreamNotFoundError()
            stored = isinstance(entry.stream.store, DeltaStore)
            with entry.stream.lock, self._catalog_upkeep.changing(name) if stored else nullcontext():
                entry.stream.deleted = True
                self._consumers.drop_stream(entry.stream)
                self._registry.unregister(name)
                self._layout.objects.delete(self._layout.stream_config_key(name))
                entry.stream.store.destroy()
                if self._keyring is not None and stream_key_tokens(entry.stream) is not None:
                    self._keyring.destroy_stream(entry.stream.stream_id)
                self._flusher.forget(name)
                self._consumers.close_stream(entry.stream, flush=False)  # its own ack store (several gateways)
        if self._cluster and self.release_stream is not None:
            self.release_stream(name)
        self._notify(name)  # waiting pulls and watches of the stream end now, not at their next timeout

    def info(self, name: str, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        """StreamInfo; with `subjects_filter`, a page of subjects from `offset` and the paging fields
        `total`, `offset`, `limit` of nats-server's answer."""
        if subjects_filter is not None and not is_valid_subject(subjects_filter):
            raise errors.bad_request(f"invalid subjects_filter {subjects_filter!r}")
        if offset < 0:
            raise errors.bad_request("offset must not be negative")
        return self.info_of(self._registry.stream(name), subjects_filter, offset)

    def list(self, subject: str | None = None, offset: int = 0, limit: int = 256) -> dict[str, Any]:
        check_page(subject, offset, limit)
        with self._registry.lock:
            entries = [e for _, e in listed(self._registry.entries, subject)]
        for entry in entries[offset : offset + limit]:
            self._registry.opened(entry)  # a page of infos opens its streams; the others stay closed
        missing = [e.stream.name for e in entries if e.stream is not None and e.stream.unavailable is not None]
        streams = [e for e in entries if e.stream is None or e.stream.unavailable is None]
        page = [self.info_of(self._registry.opened(e)) for e in streams[offset : offset + limit]]
        answer = {"total": len(streams), "offset": offset, "limit": limit, "streams": page}
        if missing:
            answer["missing"] = missing  # as JetStream lists streams it cannot reach
        return answer

    def names(self, subject: str | None = None, offset: int = 0, limit: int = 1024) -> dict[str, Any]:
        """A page of stream names (STREAM.NAMES), from the catalog: no stream is opened."""
        check_page(subject, offset, limit)
        with self._registry.lock:
            items = listed(self._registry.entries, subject)
        names = [n for n, e in items if e.stream is None or e.stream.unavailable is None]
        return {"total": len(names), "offset": offset, "limit": limit, "streams": names[offset : offset + limit]}

    def info_of(self, stream: Stream, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        """A stream's StreamInfo, stamped now."""
        state = stream.state(subjects_filter, offset)
        info = {"config": stream.config.to_json(), "created": rfc3339(stream.created_ns)}
        total = state.pop("subjects_total", 0)
        info["state"] = state_json(state)
        info["ts"] = rfc3339(self._clock.now_ns())
        if total:
            info.update(total=total, offset=offset, limit=SUBJECTS_PAGE)
        return info

    def _write_config(self, stream: Stream) -> None:
        with self._catalog_upkeep.changing(stream.name):
            action = failpoints.hit("stream.config") if failpoints.ARMED else None
            self._layout.objects.put(self._layout.stream_config_key(stream.name), orjson.dumps(record_json(stream)))
            failpoints.after("stream.config", action)

    # -- a stream's messages ------------------------------------------------------------------

    def get_message(self, name: str, seq: int) -> StoredMessage:
        return self._registry.stream(name).get(seq)

    def delete_message(self, name: str, seq: int, erase: bool = True) -> None:
        stream = self._registry.stream(name)
        if erase and isinstance(stream.store, DeltaStore):
            from engine.erasures import registry  # queues a GDPR erasure request for the erase job

            registry(self._layout).delete_and_queue(stream, seq)
        else:
            stream.delete_message(seq, erase)

    def rotate_key(self, name: str) -> int:
        """Starts a new key epoch for an encrypted stream's new writes, at once; returns it. The compaction
        job (with the keyring) re-encrypts older values and then destroys the older epochs' keys."""
        stream = self._registry.stream(name)
        sealer = getattr(stream.store, "sealer", None)
        if sealer is None:
            raise errors.bad_request(f"stream {name} is not encrypted")
        with stream.lock:
            return int(sealer.keys.rotate())

    def purge(self, name: str, filter_: str | None = None, seq: int = 0, keep: int = 0) -> int:
        return self._registry.stream(name).purge(filter_, seq, keep)
