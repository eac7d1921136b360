"""The options of one account's engine, as the gateway's command line and config give them."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.accounts.limits import UNLIMITED_LIMITS, AccountLimits
from engine.backpressure import DEFAULT_MAX_PENDING_BYTES
from engine.keys import MasterKey
from engine.messages import DEFAULT_MAX_PAYLOAD
from engine.store.backlog import DEFAULT_MAX_LOG_BYTES, DEFAULT_MAX_TOTAL_BYTES
from engine.store.delta import DEFAULT_CACHE_BYTES

DEFAULT_FLUSH_INTERVAL = 1.0
# A stream's log is committed once this many bytes wait (else every flush_interval): what a load holds
# in flight, its index rows and the commit's copies grow with it. With a million distinct subjects the
# gateway's RSS during the load was 258-265 MB at 32 MiB (the backpressure's wake-up, which bounded the
# 128 MiB this was before) and 228 MB at 16 MiB; 20 M messages on 10 subjects went in at 688k msgs/s
# against 752k, in twice the files (276), which the compaction job joins.
DEFAULT_FLUSH_BYTES = 16 * 1024 * 1024


@dataclass
class EngineOptions:
    sync_always: bool = False
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    max_payload: int = DEFAULT_MAX_PAYLOAD
    cache_bytes: int = DEFAULT_CACHE_BYTES
    account: str = "default"
    max_unflushed_bytes: int = DEFAULT_MAX_LOG_BYTES  # per log: each stream's, the ack log
    max_unflushed_total: int = DEFAULT_MAX_TOTAL_BYTES  # every log of the gateway together
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES  # a stream's uncommitted messages in memory: publishers wait
    limits: AccountLimits = UNLIMITED_LIMITS
    key: MasterKey | None = field(default=None, repr=False)  # encryption at rest (engine/encryption.py)
    prev_key: MasterKey | None = field(default=None, repr=False)  # nats-server's prev_key: re-wraps the keyring
    wal_dir: str | None = None  # local folder of the logs (default: the warehouse, or ./jetlake-state on S3)
    wal: str = "local"  # "object": the logs are objects in the warehouse (failover to another machine)
    takeover_wait: float = 0.0  # seconds to wait for another gateway's owner lease to expire
    cluster: bool = False  # several gateways: streams are owned one by one (`take`), not the warehouse
