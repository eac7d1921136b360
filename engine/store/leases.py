"""Leases with fencing tokens on the object-store interface: who may write a stream, and proof of it.

A lease is one small JSON object (`{"owner", "token", "expires_ns", "nonce"}`) that is only ever
written by a conditional write, so no lock service, `flock` or shared file system is involved:
- acquire: `create` when the object is missing (token 1); otherwise, once the record has expired or
  was released, `replace` at the version just read with `token + 1`. Of any number of gateways
  racing, the store lets exactly one write win.
- renew: `replace` at the holder's own last version with a later expiry and the same token. It fails
  if anyone acquired in between, which is how a deposed holder learns it lost the lease.
- release: `replace` with no owner and the same token; the object is never deleted, so the next
  token is always larger than every token handed out before.
The token fences the holder's writes: every fenced object (`fenced_create`, `fenced_replace`) carries
the token it was written under, and a writer that finds a larger token where it meant to write knows
it was deposed and stops (`LeaseLostError`). Writes are conditional, so a stale holder can never
overwrite what a newer holder wrote, and a newer holder never overwrites what it has not read.
Time: expiry is the writer's clock plus the TTL; a holder stops trusting its lease `margin_ns`
before that, measured from the moment it sent the write that renewed it, so clocks of gateways may
disagree by up to the margin without two holders writing at once.
A write whose answer was lost (a timeout after the server applied it) is resolved by reading the
record back: each write carries a fresh nonce, and finding one's own nonce means the write won.
Counterpart: none in nats-server (Raft elects stream leaders there); this is the fencing-token
lease of the object-store streamers, on delta-rs's primitive (`PutMode::Create`/`Update`).
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from engine.clock import Clock, SystemClock
from engine.store.objectstore import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailedError,
)

DEFAULT_TTL_NS = 10_000_000_000
LEASE_FORMAT = 1
FENCE_MAGIC = b"JLF1"
_FENCE_HEADER = struct.Struct(">4sQ")


class LeaseLostError(RuntimeError):
    """This process no longer holds the lease (or cannot be sure it does): it must not write."""


class LeaseHeldError(RuntimeError):
    """The lease is held by another owner and did not come free in time."""


@dataclass(frozen=True)
class LeaseRecord:
    owner: str
    token: int
    expires_ns: int
    nonce: str
    format: int = LEASE_FORMAT

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        fields = json.loads(data)
        if fields.get("format") != LEASE_FORMAT:
            raise ValueError(f"unknown lease format {fields.get('format')!r}")
        return cls(**fields)

    def held_at(self, now_ns: int) -> bool:
        return bool(self.owner) and now_ns < self.expires_ns


@dataclass(frozen=True)
class FencedRecord:
    """A fenced object as read: the token it was written under, its payload, its store version."""

    token: int
    payload: bytes
    version: str


class Lease:
    """One owner's handle on one lease object. Not shared between threads without a lock.

    Args:
        store: the warehouse's object store.
        key: the lease object's key, e.g. `default/_system/leases/streams/ORDERS.json`.
        owner: this holder's id, unique per process (a restarted gateway is a new owner).
        ttl_ns: how long an acquisition or renewal lasts without another renewal.
        clock: the wall clock written into `expires_ns` and compared against it.
        margin_ns: how long before expiry the holder stops trusting its lease (default a quarter of the TTL).
    """

    def __init__(self, store: ObjectStore, key: str, owner: str, ttl_ns: int = DEFAULT_TTL_NS, *,
                 clock: Clock | None = None, margin_ns: int | None = None) -> None:
        if not owner:
            raise ValueError("a lease owner needs a non-empty id")
        self.store = store
        self.key = key
        self.owner = owner
        self.ttl_ns = ttl_ns
        self.margin_ns = ttl_ns // 4 if margin_ns is None else margin_ns
        self.clock: Clock = clock or SystemClock()
        self._record: LeaseRecord | None = None
        self._version = ""
        self._trusted_until_ns = 0

    @property
    def token(self) -> int | None:
        """The fencing token while this owner holds the lease, else None."""
        return self._record.token if self._record else None

    def holder(self) -> LeaseRecord | None:
        """The lease's record as stored now (None if never acquired): who owns it, until when."""
        try:
            return LeaseRecord.from_bytes(self.store.get(self.key).data)
        except ObjectNotFoundError:
            return None

    def try_acquire(self, breakable: Callable[[LeaseRecord], bool] | None = None) -> bool:
        """Takes the lease if it is free, expired or already ours; True if this owner holds it now.

        `breakable` may declare a held record abandoned (its holder is known to be dead): it is then
        taken at once, by the same conditional write as an expired one.
        """
        if self._record is not None:
            try:
                self.renew()
                return True
            except LeaseLostError:
                pass
        now = self.clock.now_ns()
        try:
            stored = self.store.get(self.key)
        except ObjectNotFoundError:
            return self._write(LeaseRecord(self.owner, 1, now + self.ttl_ns, _nonce()), None, now)
        current = LeaseRecord.from_bytes(stored.data)
        if current.held_at(now) and not (breakable is not None and breakable(current)):
            return False
        wanted = LeaseRecord(self.owner, current.token + 1, now + self.ttl_ns, _nonce())
        return self._write(wanted, stored.version, now)

    def acquire(self, timeout: float, poll: float = 0.05,
                breakable: Callable[[LeaseRecord], bool] | None = None) -> int:
        """Waits up to `timeout` seconds for the lease; returns the token. Raises LeaseHeldError."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire(breakable):
            if time.monotonic() >= deadline:
                raise LeaseHeldError(f"lease {self.key} is held by {self.holder()}")
            time.sleep(poll)
        assert self._record is not None
        return self._record.token

    def renew(self) -> None:
        """Extends the lease. Raises LeaseLostError if another owner acquired it meanwhile."""
        if self._record is None:
            raise LeaseLostError(f"lease {self.key} is not held by {self.owner}")
        now = self.clock.now_ns()
        if not self._write(replace(self._record, expires_ns=now + self.ttl_ns, nonce=_nonce()), self._version, now):
            self._drop()
            raise LeaseLostError(f"lease {self.key} was taken over: {self.holder()}")

    def release(self) -> None:
        """Gives the lease up at once (a takeover needs no wait); a lost lease is released already."""
        if self._record is None:
            return
        record = replace(self._record, owner="", expires_ns=0, nonce=_nonce())
        try:
            self.store.replace(self.key, record.to_bytes(), self._version)
        except PreconditionFailedError:
            pass
        self._drop()

    def fence(self) -> int:
        """The token to stamp on a write, if the lease is still trusted. Raises LeaseLostError.

        Local only (no request): the holder trusts its lease until `margin_ns` before expiry.
        """
        if self._record is None or self.clock.now_ns() >= self._trusted_until_ns:
            raise LeaseLostError(f"lease {self.key} is not held (or no longer trusted) by {self.owner}")
        return self._record.token

    def check(self) -> int:
        """Reads the lease back and returns the token if this owner still holds it, before an action
        that must not happen twice. Raises LeaseLostError."""
        token = self.fence()
        current = self.holder()
        if current is None or current.owner != self.owner or current.token != token:
            self._drop()
            raise LeaseLostError(f"lease {self.key} is now {current}")
        return token

    def lost(self) -> None:
        """Forgets the lease after a fenced write found a newer token: the holder was deposed."""
        self._drop()

    def _write(self, record: LeaseRecord, version: str | None, now: int) -> bool:
        """Writes the record conditionally; True if it won (also when only reading back shows it did)."""
        data = record.to_bytes()
        try:
            meta = self.store.create(self.key, data) if version is None else self.store.replace(self.key, data, version)
            new_version = meta.version
        except ObjectStoreError:  # refused, or no answer: the record read back says who won
            try:
                stored = self.store.get(self.key)
            except ObjectNotFoundError:
                return False
            if LeaseRecord.from_bytes(stored.data).nonce != record.nonce:
                return False
            new_version = stored.version
        self._record, self._version = record, new_version
        self._trusted_until_ns = now + self.ttl_ns - self.margin_ns
        return True

    def _drop(self) -> None:
        self._record, self._version, self._trusted_until_ns = None, "", 0


def read_fenced(store: ObjectStore, key: str) -> FencedRecord:
    """A fenced object's token and payload. Raises ObjectNotFoundError, ValueError if not fenced."""
    stored = store.get(key)
    magic, token = _FENCE_HEADER.unpack_from(stored.data)
    if magic != FENCE_MAGIC:
        raise ValueError(f"{key} is not a fenced object")
    return FencedRecord(token, stored.data[_FENCE_HEADER.size:], stored.version)


def fenced_create(lease: Lease, key: str, payload: bytes) -> FencedRecord:
    """Creates `key` under the lease's token (a log record, a new config).

    Raises:
        LeaseLostError: the lease is not trusted, or the key holds a newer holder's write.
        ObjectExistsError: the key holds a write of this or an older token (the caller decides).
    """
    token = lease.fence()
    try:
        meta = lease.store.create(key, _FENCE_HEADER.pack(FENCE_MAGIC, token) + payload)
    except ObjectExistsError:
        _raise_if_superseded(lease, key, token)
        raise
    return FencedRecord(token, payload, meta.version)


def fenced_replace(lease: Lease, key: str, payload: bytes, previous: FencedRecord) -> FencedRecord:
    """Replaces the fenced object `previous` was read from, if it is still that version.

    Raises:
        LeaseLostError: the lease is not trusted, or a newer holder wrote the object.
        PreconditionFailedError: the object changed under this token's epoch (read it again).
    """
    token = lease.fence()
    if previous.token > token:
        lease.lost()
        raise LeaseLostError(f"{key} was written under token {previous.token}, this holder has {token}")
    try:
        meta = lease.store.replace(key, _FENCE_HEADER.pack(FENCE_MAGIC, token) + payload, previous.version)
    except PreconditionFailedError:
        _raise_if_superseded(lease, key, token)
        raise
    return FencedRecord(token, payload, meta.version)


def _raise_if_superseded(lease: Lease, key: str, token: int) -> None:
    try:
        found = read_fenced(lease.store, key).token
    except ObjectNotFoundError:
        return
    if found > token:
        lease.lost()
        raise LeaseLostError(f"{key} was written under token {found}, this holder has {token}")


def _nonce() -> str:
    return uuid.uuid4().hex
