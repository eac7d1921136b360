"""Crypto-shredding through the engine: an erasure of a subject prefix that selects a data key destroys
the key; its messages' bytes in the table and the log are unreadable at once, other prefixes serve,
and the request records the step."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine import JetStreamError, ManualClock
from engine.erasures import registry
from engine.keys import KeyDestroyedError, Keyring, keyring_folder
from engine.messages import InboundMessage
from engine.store import erasures as fmt
from tests.keys.test_encrypted_streams import KEY, open_engine

USERS = {"name": "USERS", "subjects": ["users.>"], "metadata": {"jetlake.key_tokens": "2"}}


def table_rows(table: Path) -> list[dict]:
    return sorted((r for p in table.rglob("*.parquet") for r in pq.read_table(p).to_pylist()), key=lambda r: r["seq"])


def test_erasing_a_key_prefix_destroys_its_key(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        js.add_stream(USERS)
        js.publish([InboundMessage(s, f"secret of {s}".encode(), {"X-Note": [s]})
                    for s in ("users.1.profile", "users.1.orders", "users.2.profile", "users.2.orders")])
        js.flush()
        js.publish_one("users.1.profile", b"still in the log")  # seq 5

        partial = registry(js.layout).erase(js.stream("USERS"), filter_="users.2.profile")
        assert "key_destroyed" not in partial  # users.2.orders lives on under the same key
        assert js.get_message("USERS", 4).data == b"secret of users.2.orders"

        answer = registry(js.layout).erase(js.stream("USERS"), filter_="users.1.>")
        assert answer["messages"] == 3 and "key_destroyed" in answer
        record = fmt.read_request(js.layout, answer["id"])
        assert record is not None and record["keys_destroyed"] == 1 and record["key_destroyed"] > 0
        assert registry(js.layout).get(answer["id"])["key_destroyed"] == answer["key_destroyed"]
        for seq in (1, 2, 5):
            with pytest.raises(JetStreamError) as raised:
                js.get_message("USERS", seq)
            assert raised.value.err_code == 10037

        sealer = js.stream("USERS").store.sealer
        rows = [r for r in table_rows(js.layout.stream_table("USERS")) if r["subject"].startswith("users.1.")]
        assert len(rows) == 2  # the bytes are still there until the erase job runs ...
        other = Keyring.open(keyring_folder(js.layout.root), "default", KEY).stream(sealer.keys.stream_id, 2)
        for row in rows:  # ... and no process can open them any more
            with pytest.raises(KeyDestroyedError):
                other.open_one("data", row["seq"], row["subject"], row["data"])
        js.publish_one("users.1.profile", b"a new life")  # a new key for the prefix
        assert js.get_message("USERS", 6).data == b"a new life"
    finally:
        js.close()

    js = open_engine(warehouse, clock)  # the log's record of seq 5 replays with its key gone
    try:
        assert [m.seq for m in js.stream("USERS").load_many(list(range(1, 7)))] == [4, 6]
        assert js.get_message("USERS", 6).data == b"a new life"
        js.flush()
        assert js.get_message("USERS", 4).data == b"secret of users.2.orders"
    finally:
        js.close()
