"""The S3 server of the tests is a real one that enforces conditional writes under concurrency.

Checked with obstore (the client the warehouse uses, on the Rust crate delta-rs commits with),
straight against the server, below JetLake's own storage interface: `If-None-Match: *` lets exactly
one of N concurrent creators win, `If-Match` refuses a stale ETag with 412, and of N concurrent
compare-and-swaps from one ETag exactly one wins. Also: `scripts/s3-server.sh` stops on SIGTERM.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import S3Store

from tests.s3 import ACCESS_KEY, BUCKET, SECRET_KEY, S3Server, versitygw_binary

WRITERS = 8
ROUNDS = 5


def _store(server: S3Server) -> S3Store:
    server.location("bucket-check").open()  # creates the bucket if missing
    return S3Store(
        BUCKET,
        prefix=f"server-{uuid.uuid4().hex[:8]}",
        config={"endpoint": server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                "region": "us-east-1", "conditional_put": "etag"},
        client_options={"allow_http": True},
    )


def _race(writers: int, attempt: Callable[[int], object]) -> list[str]:
    """Runs `attempt(i)` in `writers` threads released at once; returns each outcome."""
    barrier = threading.Barrier(writers)

    def run(i: int) -> str:
        barrier.wait(timeout=30)
        try:
            attempt(i)
            return "won"
        except (AlreadyExistsError, PreconditionError):
            return "refused"

    with ThreadPoolExecutor(writers) as pool:
        return list(pool.map(run, range(writers)))


def test_concurrent_creates_of_one_key_have_exactly_one_winner(s3_server: S3Server) -> None:
    store = _store(s3_server)
    for round_ in range(ROUNDS):
        key = f"create-{round_}"
        outcomes = _race(WRITERS, lambda i, key=key: obstore.put(store, key, f"writer {i}".encode(), mode="create"))
        assert outcomes.count("won") == 1, outcomes
        assert outcomes.count("refused") == WRITERS - 1, outcomes
        winner = outcomes.index("won")
        assert bytes(obstore.get(store, key).bytes()) == f"writer {winner}".encode()


def test_if_match_refuses_a_stale_etag_and_one_of_concurrent_swaps_wins(s3_server: S3Server) -> None:
    store = _store(s3_server)
    first = obstore.put(store, "cas", b"v0", mode="create")["e_tag"]
    second = obstore.put(store, "cas", b"v1", mode={"e_tag": first})["e_tag"]
    assert second != first
    with pytest.raises(PreconditionError):
        obstore.put(store, "cas", b"stale", mode={"e_tag": first})
    assert bytes(obstore.get(store, "cas").bytes()) == b"v1"

    etag = second
    for round_ in range(ROUNDS):
        outcomes = _race(
            WRITERS, lambda i, r=round_, e=etag: obstore.put(store, "cas", f"r{r} w{i}".encode(), mode={"e_tag": e})
        )
        assert outcomes.count("won") == 1, outcomes
        winner = outcomes.index("won")
        result = obstore.get(store, "cas")
        assert bytes(result.bytes()) == f"r{round_} w{winner}".encode()
        etag = result.meta["e_tag"]


def test_if_match_on_a_missing_key_is_refused(s3_server: S3Server) -> None:
    store = _store(s3_server)
    etag = obstore.put(store, "gone", b"x", mode="create")["e_tag"]
    obstore.delete(store, "gone")
    with pytest.raises((PreconditionError, FileNotFoundError)):
        obstore.put(store, "gone", b"y", mode={"e_tag": etag})


def test_the_script_runs_in_the_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    binary = versitygw_binary()
    if binary is None:
        pytest.skip("the S3 server (versitygw) is not installed: scripts/setup.sh builds it when Go is on PATH")
    server = S3Server(tmp_path / "data", binary).start()
    assert server.proc is not None
    pid = server.proc.pid
    assert server.stop() == 0, "SIGTERM ends the server cleanly (the script execs it: one PID)"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (tmp_path / "data").is_dir()
