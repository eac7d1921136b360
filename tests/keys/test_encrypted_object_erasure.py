"""Erasing an object by name on an encrypted object store, through a real gateway and the erase job:
the infos stored only in the table are ciphertext, and the chunks they name must be found all the same
(engine/erasures.py opens them with the stream's keys). Afterwards no byte of the chunks' ciphertext,
and no marker in clear, is left under the warehouse, and the object is gone from reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine.store.layout import Layout
from jobs.scheduler import run_job
from tests.gateway import Gateway
from tests.residue import find_residue, needles_for

pytestmark = pytest.mark.spark

KEY = "object-erasure-key-0123456789abcdef"
MARKER = "Ob7-chunk-marker"
CIPHERTEXT_SAMPLE = slice(17, 49)  # 32 bytes of a sealed value's ciphertext (after version, key id and IV)


def chunk_values(table: Path, nuid: str) -> dict[int, bytes]:
    """The stored (sealed) values of an object's chunks, by seq, read straight from the table."""
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["seq", "subject", "data"]).to_pylist()
    return {r["seq"]: r["data"] for r in rows if r["subject"].endswith(f".C.{nuid}")}


def test_an_object_stored_only_in_the_table_is_erased_with_its_chunks(
        spark: SparkSession, tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "server.conf"
    config.write_text(f'jetstream {{ key: "{KEY}", cipher: aes }}\n')
    layout = Layout(warehouse)
    payload = (MARKER.encode() + bytes(range(256))) * 1200  # about 320 KB: several chunks
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client() as c:
            assert c.post("/v1/objects", json={"bucket": "scans"}).status_code == 201
            assert c.put("/v1/objects/scans/data/passport.png", content=payload).status_code in (200, 201)
            assert c.put("/v1/objects/scans/data/other.png", content=b"kept").status_code in (200, 201)
            info = c.get("/v1/objects/scans/info/passport.png").json()
            assert info["chunks"] > 1
            assert c.post("/v1/flush").json()["success"]
        gateway.stop()  # the restart leaves the infos and chunks in the table only (no buffer, no log)
        gateway.start()

        sealed = chunk_values(layout.stream_table("OBJ_scans"), info["nuid"])
        assert len(sealed) == info["chunks"]
        assert all(MARKER.encode() not in v for v in sealed.values())
        needles = {f"chunk {seq}": v[CIPHERTEXT_SAMPLE] for seq, v in sealed.items()}
        assert len(find_residue(warehouse, needles)) >= len(needles)  # the scan sees the ciphertext before

        with gateway.client() as c:
            resp = c.post("/v1/erasures", json={"bucket": "scans", "object": "passport.png"})
            assert resp.status_code == 202, resp.text
            assert resp.json()["messages"] == info["chunks"] + 1
            assert c.get("/v1/objects/scans/info/passport.png").status_code == 404
            assert c.get("/v1/objects/scans/data/passport.png").status_code == 404
            assert c.post("/v1/flush").json()["success"]

            figures = run_job(spark, layout, "erase")
            assert figures["requests_done"] == 1, figures

            assert c.get("/v1/objects/scans/data/passport.png").status_code == 404
            assert c.get("/v1/objects/scans/data/other.png").content == b"kept"
    finally:
        gateway.stop()
    assert chunk_values(layout.stream_table("OBJ_scans"), info["nuid"]) == {}
    assert find_residue(warehouse, {**needles, **needles_for(MARKER)}) == []
