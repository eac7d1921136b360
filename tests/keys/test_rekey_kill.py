"""kill -9 of the compaction job in the middle of its re-encryption after a key rotation: killed before
its MERGE, after the MERGE of one stream (before its older keys are destroyed), and after the first of
two streams is done; after each kill every acknowledged value still opens, and a rerun finishes with
nothing lost, no value under an older key and the older keys destroyed. One of the streams protects its
subjects, so their re-encryption is killed and finished too."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream, ManualClock
from engine.encryption import PROTECTED_SUBJECTS_KEY
from engine.keys import KeyDestroyedError, Keyring, keyring_folder
from engine.keys.master import CIPHER_ENV, KEY_ENV
from engine.messages import InboundMessage
from jobs import compact
from tests.jobs.kills import kill_job_at
from tests.keys.test_encrypted_streams import KEY, open_engine

pytestmark = pytest.mark.spark

SECRET = "engine-test-key-0123456789abcdef"  # tests/keys/test_encrypted_streams.py's KEY, for the CLI
STREAMS = {
    "ALPHA": {"name": "ALPHA", "subjects": ["alpha.>"]},
    "OMEGA": {"name": "OMEGA", "subjects": ["omega.>"], "metadata": {PROTECTED_SUBJECTS_KEY: "true"}},
}
Acked = dict[str, dict[int, tuple[str, bytes]]]  # stream -> seq -> (subject, data)


def kill_compaction_at(warehouse: Path, spec: str, step: str) -> None:
    """`jetlake jobs run compact` with the key in its environment, killed by the failpoint `spec` at `step`."""
    kill_job_at(warehouse, "compact", step, spec=spec, env={KEY_ENV: SECRET, CIPHER_ENV: "aes"})


def key_ids(table: Path, columns: tuple[str, ...]) -> set[int]:
    values = DeltaTable(str(table)).to_pyarrow_table(columns=list(columns))
    return {int.from_bytes(v[1:5], "big") for c in columns for v in values.column(c).to_pylist() if v}


def destroyed(warehouse: Path, stream_id: str, key_ids: set[int]) -> list[bool]:
    """Whether each key is destroyed, as a fresh process sees the keyring (no cached key)."""
    keys = Keyring.open(keyring_folder(warehouse / "default"), "default", KEY).stream(stream_id)
    out = []
    for key_id in sorted(key_ids):
        try:
            keys.key(key_id)
            out.append(False)
        except KeyDestroyedError:
            out.append(True)
    return out


def assert_every_value_opens(warehouse: Path, clock: ManualClock, acked: Acked) -> None:
    """A restart (OMEGA's index rebuilt from its table's sealed subjects) reads every acknowledged message."""
    js = open_engine(warehouse, clock)
    try:
        for name, messages in acked.items():
            found = js.stream(name).load_many(sorted(messages))
            assert {m.seq: (m.subject, m.data) for m in found} == messages, name
            assert js.stream(name).last_by_subject(messages[max(messages)][0]).seq == max(messages)
    finally:
        js.close()
    js.layout.objects.delete(js.layout.index_snapshot_key("OMEGA"))


def fill(js: JetStream) -> Acked:
    """Two epochs of values in each stream's table: 120 messages, a rotation, 60 more."""
    acked: Acked = {name: {} for name in STREAMS}
    for name, config in STREAMS.items():
        js.add_stream(config)
    for first, count in ((0, 120), (120, 60)):
        for name in STREAMS:
            batch = [InboundMessage(f"{name.lower()}.u{i % 4}.x{i}", b"value %d" % i) for i in range(first, first + count)]
            for msg, result in zip(batch, js.publish(batch), strict=True):
                acked[name][result.seq] = (msg.subject, msg.data)
        js.flush()
        if first == 0:
            assert all(js.rotate_key(name) == 2 for name in STREAMS)
    return acked


def test_compaction_killed_mid_reencryption_is_finished_by_a_rerun(spark: SparkSession, warehouse: Path,
                                                                   clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        acked = fill(js)
        stream_ids = {name: js.stream(name).stream_id for name in STREAMS}
    finally:
        js.close()
    tables = {name: js.layout.stream_table(name) for name in STREAMS}
    columns = {"ALPHA": ("data", "headers"), "OMEGA": ("data", "headers", "subject")}
    ring = Keyring.open(keyring_folder(js.layout.root), "default", KEY)
    first_epoch = {name: {k for k in key_ids(tables[name], ("data",)) if ring.stream(stream_ids[name]).epoch_of(k) == 1}
                   for name in STREAMS}
    assert all(first_epoch.values())

    kill_compaction_at(warehouse, "rekey.merge=kill", "rekey.merge")  # before any MERGE
    assert all(key_ids(tables[n], columns[n]) & first_epoch[n] for n in STREAMS)
    assert_every_value_opens(warehouse, clock, acked)

    kill_compaction_at(warehouse, "rekey.merged=kill", "rekey.merged")  # ALPHA re-encrypted, its keys not destroyed
    assert not key_ids(tables["ALPHA"], columns["ALPHA"]) & first_epoch["ALPHA"]
    assert key_ids(tables["OMEGA"], columns["OMEGA"]) & first_epoch["OMEGA"]
    assert not any(destroyed(warehouse, stream_ids["ALPHA"], first_epoch["ALPHA"]))  # nothing retired yet
    assert_every_value_opens(warehouse, clock, acked)

    kill_compaction_at(warehouse, "rekey.merged=kill@2", "rekey.merged")  # ALPHA finished, OMEGA merged only
    assert not key_ids(tables["OMEGA"], columns["OMEGA"]) & first_epoch["OMEGA"]
    assert all(destroyed(warehouse, stream_ids["ALPHA"], first_epoch["ALPHA"]))
    assert not any(destroyed(warehouse, stream_ids["OMEGA"], first_epoch["OMEGA"]))
    assert_every_value_opens(warehouse, clock, acked)

    figures = compact.run(spark, js.layout, keyring=ring)  # the rerun
    assert figures["rekey_errors"] == 0 and figures["streams_rekeyed"] == 1, figures
    assert figures["rows_reencrypted"] == 0 and figures["keys_retired"] >= 1, figures  # OMEGA only retires
    for name in STREAMS:
        assert not key_ids(tables[name], columns[name]) & first_epoch[name]
        assert all(destroyed(warehouse, stream_ids[name], first_epoch[name]))
    assert_every_value_opens(warehouse, clock, acked)
    assert compact.run(spark, js.layout, keyring=ring)["streams_rekeyed"] == 0
