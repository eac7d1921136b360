"""The `jetstream {}` blocks of a nats-server config file: the server's (where its data goes, its
memory and file budgets) and an account's (its limits), each with JetLake's encryption-at-rest keys.

Read by the config processing (engine/accounts/config.py) through its `Reader`, so that every mistake
is collected with its position, as nats-server collects them. Counterpart: server/opts.go
(parseJetStream, parseJetStreamForAccount).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.accounts.limits import UNLIMITED_LIMITS, AccountLimits
from engine.accounts.syntax import Token
from engine.accounts.values import Reader

_IGNORED_JETSTREAM = frozenset(
    "strict domain extension_hint limits tpm unique_tag max_outstanding_catchup max_buffered_size "
    "max_buffered_msgs request_queue_limit info_queue_limit meta_compact meta_compact_size "
    "meta_compact_sync max_concurrent_io".split()
)
_ACCOUNT_LIMITS = {
    "max_memory": "max_memory", "max_mem": "max_memory", "mem": "max_memory", "memory": "max_memory",
    "max_store": "max_storage", "max_file": "max_storage", "max_disk": "max_storage",
    "store": "max_storage", "disk": "max_storage",
    "max_streams": "max_streams", "streams": "max_streams",
    "max_consumers": "max_consumers", "consumers": "max_consumers",
    "max_ack_pending": "max_ack_pending",
    "mem_max_stream_bytes": "memory_max_stream_bytes", "memory_max_stream_bytes": "memory_max_stream_bytes",
    "disk_max_stream_bytes": "storage_max_stream_bytes", "store_max_stream_bytes": "storage_max_stream_bytes",
}  # fmt: skip


@dataclass(frozen=True)
class JetStreamConfig:
    """The server's `jetstream {}` block: what JetLake keeps of it."""

    store_dir: str | None = None
    max_memory_store: int | None = None
    max_file_store: int | None = None
    sync_always: bool | None = None
    key: str | None = field(default=None, repr=False)
    prev_key: str | None = field(default=None, repr=False)
    cipher: str | None = None


def server_jetstream(r: Reader, token: Token) -> JetStreamConfig | None:
    """The server's block; None when it is a flag (`enabled`, `true`), which leaves the defaults."""
    value = token.value
    if isinstance(value, bool) or isinstance(value, str):
        enabled = value if isinstance(value, bool) else value.lower() in ("enabled", "enable")
        if isinstance(value, str) and value.lower() not in ("enabled", "enable", "disabled", "disable"):
            r.error(token, f"Expected 'enabled' or 'disabled' for string value, got '{value}'")
        elif not enabled:
            r.error(token, "JetLake is JetStream: the jetstream block cannot disable it")
        return None
    kept: dict[str, object] = {}
    for key, item in r.entries(token, "jetstream"):
        if key in ("store", "store_dir", "storedir"):
            kept["store_dir"] = r.string(item, key)
        elif key in ("sync", "sync_interval"):
            kept["sync_always"] = isinstance(item.value, str) and item.value.lower() == "always"
        elif key in ("max_memory_store", "max_mem_store", "max_mem"):
            kept["max_memory_store"] = r.storage_size(item, "max_mem_store")
        elif key in ("max_file_store", "max_file"):
            kept["max_file_store"] = r.storage_size(item, "max_file_store")
        elif encryption_option(r, key, item, kept):
            pass
        elif key in ("enable", "enabled"):
            if r.boolean(item, key) is False:
                r.error(item, "JetLake is JetStream: the jetstream block cannot disable it")
        elif key in _IGNORED_JETSTREAM:
            r.ignored(item, key)
        else:
            r.unknown(item, key)
    return JetStreamConfig(**kept)  # type: ignore[arg-type]


def account_jetstream(r: Reader, token: Token, encryption: dict[str, str | None]) -> AccountLimits | None:
    """An account's block: its limits (None: JetStream off for it); its encryption options go to `encryption`."""
    value = token.value
    if isinstance(value, bool):
        return UNLIMITED_LIMITS if value else None
    if isinstance(value, str):
        if value.lower() in ("enabled", "enable"):
            return UNLIMITED_LIMITS
        if value.lower() in ("disabled", "disable"):
            return None
        r.error(token, f"Expected 'enabled' or 'disabled' for string value, got '{value}'")
        return None
    fields: dict[str, int | bool] = {}
    for key, item in r.entries(token, "jetstream"):
        if key in _ACCOUNT_LIMITS:
            number = r.integer(item, key)
            if number is not None:
                fields[_ACCOUNT_LIMITS[key]] = number
        elif key in ("max_bytes_required", "max_stream_bytes", "max_bytes"):
            flag = r.boolean(item, key)
            if flag is not None:
                fields["max_bytes_required"] = flag
        elif key == "cluster_traffic":
            r.ignored(item, key)
        elif not encryption_option(r, key, item, encryption):
            r.unknown(item, key)
    return AccountLimits(**fields)  # type: ignore[arg-type]


def encryption_option(r: Reader, key: str, item: Token, kept: dict[str, object]) -> bool:
    """`key`, `prev_key` and `cipher` of a `jetstream {}` block (the server's or an account's, JetLake's
    extension); False for any other option."""
    if key in ("key", "ek", "encryption_key"):
        kept["key"] = r.string(item, key)
    elif key in ("prev_key", "prev_ek", "prev_encryption_key"):
        kept["prev_key"] = r.string(item, key)
    elif key == "cipher":
        cipher = r.string(item, key)
        if cipher is not None and cipher.lower() not in ("chacha", "chachapoly", "aes"):
            r.error(item, f"Unknown cipher type: {cipher!r}")
        kept["cipher"] = cipher.lower() if cipher else None
    else:
        return False
    return True
