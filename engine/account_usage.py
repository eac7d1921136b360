"""An account's JetStream limits applied to its streams, and its usage as AccountInfo reports it.

While the account limits its bytes every publish sums every stream's bytes (`exceeds`, the streams'
quota), so every stream is opened. An account info counts a stream not opened yet by the counters
the catalog copy holds for it (engine/catalog_upkeep.py) while they still hold. Counterpart:
server/jetstream.go `jsAccount` (its limits and `storageTotals`) and `JetStreamAccountInfo`.
"""

from __future__ import annotations

from typing import Any

from engine.accounts import limits as account_limits
from engine.accounts.limits import AccountLimits
from engine.catalog_upkeep import CatalogUpkeep
from engine.consumers import Consumers
from engine.stream_factory import StreamFactory
from engine.stream_registry import StreamRegistry


class AccountUsage:
    """The account's limits (a config reload may replace them) and what its streams use of them."""

    def __init__(self, limits: AccountLimits, registry: StreamRegistry, factory: StreamFactory,
                 consumers: Consumers, catalog_upkeep: CatalogUpkeep) -> None:
        self._registry = registry
        self._factory = factory
        self._consumers = consumers
        self._catalog_upkeep = catalog_upkeep
        self._limits = limits
        consumers.limits = limits
        factory.quota = self if limits.limits_bytes else None

    @property
    def limits(self) -> AccountLimits:
        """The account's JetStream limits (engine/accounts/limits.py); a config reload may replace them."""
        return self._limits

    @limits.setter
    def limits(self, value: AccountLimits) -> None:
        self._limits = value
        self._consumers.limits = value
        self._factory.quota = self if value.limits_bytes else None
        if value.limits_bytes:  # every publish sums every stream's bytes
            self._registry.open_all()
        for stream in self._registry.streams():
            stream.quota = self if value.limits_bytes else None

    def exceeds(self, storage: str, size: int) -> bool:
        """Whether `size` more bytes of `storage` go over the account's limit (a stream's publish asks)."""
        used = sum(s.index.bytes for s in self._registry.opened_now() if s.config.storage == storage)
        return account_limits.would_exceed(self._limits, storage, used, size)

    def info(self) -> dict[str, Any]:
        """JetStream's AccountInfo (without `api`, which the front doors count): usage and limits. A
        stream not opened yet counts by the counters the catalog copy holds for it, when its table and
        tombstones are still where they were when they were written; otherwise it is opened."""
        entries = self._registry.items()
        memory = storage = consumers = 0
        for name, entry in entries:
            counted = (self._catalog_upkeep.stored_counters(name, entry, self._registry.tombstones)
                       if entry.stream is None else None)
            if counted is None:
                stream = self._registry.opened(entry)
                used, consumers = stream.index.bytes, consumers + stream.consumer_count
            else:
                used, consumers = counted["bytes"], consumers + self._consumers.unrestored_count(name)
            if entry.shape.storage == "memory":
                memory += used
            else:
                storage += used
        configs = [entry.shape for _, entry in entries]
        return {
            "memory": memory,
            "storage": storage,
            "reserved_memory": account_limits.reserved_bytes(configs, "memory"),
            "reserved_storage": account_limits.reserved_bytes(configs, "file"),
            "streams": len(entries),
            "consumers": consumers,
            "limits": self._limits.to_json(),
        }
