"""A large object streamed through a real gateway both ways, neither side holding it in memory: the
client generates and hashes it on the fly, and the gateway's peak RSS stays far below its size.

The 1 GiB case takes about 30 s on a 2-core machine and runs by default; `-m "not large"` skips it.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.gateway import Gateway

MiB = 1024 * 1024
BLOCK = MiB
POOL_BLOCKS = 8


def peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def generated(size: int, sha: hashlib._Hash) -> Iterator[bytes]:
    """`size` pseudo-random bytes, block by block, each a different window of a small random pool."""
    pool = np.random.default_rng(size).bytes(POOL_BLOCKS * BLOCK)
    for i in range(size // BLOCK):
        offset = (i * 7919 * 64) % ((POOL_BLOCKS - 1) * BLOCK)
        block = pool[offset : offset + BLOCK]
        sha.update(block)
        yield block


@pytest.mark.parametrize(
    ("size", "rss_limit"),
    [(64 * MiB, 700 * MiB), pytest.param(1024 * MiB, 700 * MiB, marks=pytest.mark.large)],
    ids=["64MiB", "1GiB"],
)
def test_large_object_streams_through_the_gateway(gateway: Gateway, size: int, rss_limit: int) -> None:
    assert gateway.proc is not None
    with gateway.client() as c:
        c.timeout = 600
        c.post("/v1/objects", json={"bucket": "large"}).raise_for_status()

        sent = hashlib.sha256()
        started = time.monotonic()
        r = c.put("/v1/objects/large/data/blob", content=generated(size, sent), headers={"Content-Length": str(size)})
        put_seconds = time.monotonic() - started
        assert r.status_code == 200, r.text
        digest = "SHA-256=" + base64.urlsafe_b64encode(sent.digest()).decode()
        info = r.json()
        assert (info["size"], info["chunks"], info["digest"]) == (size, size // (128 * 1024), digest)

        received = hashlib.sha256()
        length = 0
        started = time.monotonic()
        with c.stream("GET", "/v1/objects/large/data/blob") as got:
            assert got.status_code == 200
            assert (got.headers["content-length"], got.headers["digest"]) == (str(size), digest)
            for piece in got.iter_raw(BLOCK):
                received.update(piece)
                length += len(piece)
        get_seconds = time.monotonic() - started
        assert length == size and received.digest() == sent.digest()

    peak = peak_rss(gateway.proc.pid)
    print(
        f"\n{size // MiB} MiB: put {size / put_seconds / 1e6:.1f} MB/s, get {size / get_seconds / 1e6:.1f} MB/s, "
        f"gateway peak RSS {peak / MiB:.0f} MiB"
    )
    assert peak < rss_limit, f"the gateway's peak RSS was {peak / MiB:.0f} MiB for a {size // MiB} MiB object"
