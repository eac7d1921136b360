"""The accounts of a gateway: one JetStream engine per account with JetStream, each its own warehouse tree.

An account is `warehouse/<account>/`: its streams, consumers, buckets, erasures, write-ahead log and
ack table live there and nowhere else, so nothing one account does can reach another's files. The
registry opens an engine for every account whose config enables JetStream and gives it the account's
limits; an account without JetStream has no engine (its requests get 10039). A reload (SIGHUP)
applies a new config: new accounts are opened, changed limits applied; an account that disappears
keeps its engine open until the gateway stops (its users are gone, so nothing reaches it), which
drops no request in flight. An operator then deletes such an account's data (`delete`,
engine/accounts/deletion.py): its engine closes, its keyring and tree go, and the front doors are told.
Counterpart: the account handling of server/jetstream.go (`configAllJetStreamAccounts`,
`EnableJetStream`, `UpdateJetStreamLimits`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.accounts.config import AccountConfig, ServerConfig
from engine.accounts.deletion import account_in_config, check_account_name, delete_account
from engine.accounts.limits import not_enabled
from engine.clock import Clock
from engine.encryption import master_keys
from engine.jetstream import EngineOptions, JetStream
from engine.store.backlog import Backlog
from engine.store.objectstore import WarehouseLocation

log = logging.getLogger(__name__)


@dataclass
class ApiStats:
    """JetStream's per-account API counters (AccountInfo `api`), plus the refusals of permission checks."""

    total: int = 0
    errors: int = 0
    denied: int = 0


@dataclass
class Account:
    name: str
    config: AccountConfig
    engine: JetStream | None  # None: JetStream is not enabled for the account
    api: ApiStats = field(default_factory=ApiStats)

    def jetstream(self) -> JetStream:
        """The account's engine, or JetStream's 10039 when the account has none."""
        if self.engine is None or self.config.jetstream is None:
            raise not_enabled()
        return self.engine


class Accounts:
    """Every account of the current config, by name."""

    def __init__(self, warehouse: str | Path | WarehouseLocation, options: EngineOptions, config: ServerConfig,
                 clock: Clock | None = None) -> None:
        self.warehouse = warehouse if isinstance(warehouse, WarehouseLocation) else WarehouseLocation.parse(warehouse)
        self.options = options
        self.clock = clock
        self.config = config
        # One bound on unflushed log bytes for the gateway, whichever account writes them.
        self.backlog = Backlog(options.max_unflushed_bytes, options.max_unflushed_total)
        self._accounts: dict[str, Account] = {}
        self._lock = threading.Lock()
        self.on_deleted: list[Callable[[str], None]] = []  # front doors drop the account's clients (any thread)

    def open(self, start_flusher: bool = True) -> None:
        """Opens an engine per JetStream account; on a failure the ones opened are closed again."""
        self._start_flusher = start_flusher
        try:
            for name, account in self.config.accounts.items():
                self._accounts[name] = Account(name, account, self._open_engine(account))
        except BaseException:
            self.close()
            raise

    def _open_engine(self, account: AccountConfig) -> JetStream | None:
        if account.jetstream is None:
            return None
        key, prev_key = master_keys(self.config.jetstream, account)
        options = dataclasses.replace(self.options, account=account.name, limits=account.jetstream, key=key,
                                      prev_key=prev_key)
        engine = JetStream(self.warehouse, options, clock=self.clock, backlog=self.backlog)
        engine.open(start_flusher=self._start_flusher)
        log.info("account %s: JetStream open on %s", account.name, engine.layout)
        return engine

    def get(self, name: str) -> Account | None:
        """An account of the current config (one a reload removed is gone, though its engine runs on)."""
        return self._accounts.get(name) if name in self.config.accounts else None

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._accounts.values()))

    def engines(self) -> list[JetStream]:
        return [a.engine for a in self if a.engine is not None]

    def names(self) -> list[str]:
        """The accounts of the current config (an account removed by a reload is not listed)."""
        return sorted(n for n in self._accounts if n in self.config.accounts)

    def reload(self, config: ServerConfig) -> list[str]:
        """Applies a new config; returns what changed, for the log. Engines of new accounts are opened
        before the config is swapped in, so a failure leaves the running config as it was."""
        changes: list[str] = []
        with self._lock:
            opened: dict[str, Account] = {}
            try:
                for name, account in config.accounts.items():
                    current = self._accounts.get(name)
                    if current is None or (current.engine is None and account.jetstream is not None):
                        opened[name] = Account(name, account, self._open_engine(account))
                        if current is not None:
                            opened[name].api = current.api
                        changes.append(f"account {name} added")
            except BaseException:
                for account in opened.values():
                    if account.engine is not None:
                        account.engine.close()
                raise
            for name, account in config.accounts.items():
                current = self._accounts.get(name)
                if name in opened or current is None:
                    continue
                if current.engine is not None and account.jetstream is not None and current.engine.limits != account.jetstream:
                    current.engine.limits = account.jetstream
                    changes.append(f"account {name}: limits changed")
                if current.engine is not None and account.jetstream is None:
                    changes.append(f"account {name}: JetStream turned off (its data is kept)")
                current.config = account
            self._accounts.update(opened)
            changes += [f"account {n} removed (its data is kept)" for n in self._accounts if n not in config.accounts and n in self.config.accounts]
            self.config = config
        return changes

    def delete(self, name: str) -> dict[str, Any]:
        """Deletes an account that left the config: its engine (still open since the reload that removed
        it) closes without flushing, then its keyring and data go; returns the deletion's receipt.

        Raises:
            JetStreamError: 409 while the config has the account or another gateway owns it; 404 when
                the warehouse holds nothing of it.
        """
        with self._lock:
            if check_account_name(name) in self.config.accounts:
                raise account_in_config(name)
            removed = self._accounts.pop(name, None)
            if removed is not None and removed.engine is not None:
                removed.engine.close(flush=False)
            receipt = delete_account(self.warehouse, name, self.options.wal_dir, self.clock)
        for listener in list(self.on_deleted):
            listener(name)
        return receipt

    def close(self) -> None:
        for account in list(self._accounts.values()):
            if account.engine is not None:
                account.engine.close()
