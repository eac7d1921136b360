"""A gateway stand-in for the lease race tests, run as its own process:

    python -m tests.lease_worker WAREHOUSE_URI OWNER ROUNDS JOURNAL

Takes the lease ROUNDS times; each time journals `enter OWNER TOKEN`, adds 1 to a fenced counter
object, journals `exit OWNER TOKEN` and releases. The S3 endpoint comes from the AWS variables.
"""

from __future__ import annotations

import os
import sys

from engine.store.leases import Lease, fenced_create, fenced_replace, read_fenced
from engine.store.objectstore import ObjectExistsError, ObjectNotFoundError, ObjectStore, WarehouseLocation

LEASE_KEY = "leases/race.json"
COUNTER_KEY = "race/counter"
TTL_NS = 60_000_000_000


def bump(lease: Lease, store: ObjectStore) -> None:
    """Adds 1 to the counter under the lease's token (creating it at 1)."""
    try:
        current = read_fenced(store, COUNTER_KEY)
    except ObjectNotFoundError:
        try:
            fenced_create(lease, COUNTER_KEY, b"1")
            return
        except ObjectExistsError:
            current = read_fenced(store, COUNTER_KEY)
    fenced_replace(lease, COUNTER_KEY, str(int(current.payload) + 1).encode(), current)


def journal(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main(uri: str, owner: str, rounds: int, journal_path: str) -> None:
    store = WarehouseLocation.parse(uri).open()
    lease = Lease(store, LEASE_KEY, owner, TTL_NS)
    for _ in range(rounds):
        token = lease.acquire(timeout=120, poll=0.005)
        journal(journal_path, f"enter {owner} {token}\n")
        bump(lease, store)
        journal(journal_path, f"exit {owner} {token}\n")
        lease.release()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
