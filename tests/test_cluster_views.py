"""Two real gateway processes on one warehouse (`jetlake serve --workers 2`): account-wide views show
every stream of the account whichever gateway answers (stream list with its paging and subject
filter, account info, KV bucket list), and a batch publish whose subjects belong to streams of both
gateways is split by owner and answered per message in order, as one gateway answers it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api.http import binary_batch
from tests.gateway import JETLAKE, free_port, wait_for_workers


@dataclass
class Cluster:
    url: str  # the shared port
    warehouse: Path
    gateways: dict[str, str]  # member id -> its own HTTP address


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("views")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(root / "workers.log", "wb") as log:
        proc = subprocess.Popen([str(JETLAKE), "serve", "--warehouse", str(root / "warehouse"), "--port", str(port),
                                 "--workers", "2", "--no-scheduler"], stdout=log, stderr=subprocess.STDOUT)
        try:
            yield Cluster(url, root / "warehouse", wait_for_workers(url, proc, 2))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def _owner(cluster: Cluster, stream: str) -> str:
    lease = cluster.warehouse / "default" / "_system" / "leases" / "streams" / f"{stream}.json"
    deadline = time.monotonic() + 30
    while not lease.exists():
        assert time.monotonic() < deadline, f"stream {stream} has no owner"
        time.sleep(0.05)
    return str(json.loads(lease.read_text())["owner"])


def _streams_on_both(cluster: Cluster, c: httpx.Client) -> dict[str, str]:
    """Streams V0, V1, ... made until both gateways own some (rendezvous hashing spreads them);
    returns each stream's owner address."""
    owners: dict[str, str] = {}
    for i in range(24):
        name = f"V{i}"
        made = c.post("/v1/streams", json={"name": name, "subjects": [f"v{i}.>"]})
        assert made.status_code == 201, made.text
        owners[name] = cluster.gateways[_owner(cluster, name)]
        if i >= 3 and len(set(owners.values())) == 2:
            return owners
    raise AssertionError("24 streams all went to one gateway")


def test_account_wide_views_show_every_gateways_streams(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=30.0) as c:
        owners = _streams_on_both(cluster, c)
        names = sorted(owners)
        for i, name in enumerate(names):
            batch = [{"subject": f"{name.lower()}.x", "text": f"m{n}"} for n in range(i + 1)]
            assert c.post("/v1/publish", json={"messages": batch}).status_code == 200
        for name in names[:2]:
            made = c.post(f"/v1/streams/{name}/consumers", json={"durable_name": "C", "ack_policy": "explicit"})
            assert made.status_code in (200, 201), made.text
        for bucket in ("kv_a", "kv_b"):
            assert c.post("/v1/kv", json={"bucket": bucket}).status_code in (200, 201)
    everything = sorted([*names, "KV_kv_a", "KV_kv_b"])
    for gateway in sorted(set(cluster.gateways.values())):
        with httpx.Client(base_url=gateway, timeout=30.0) as c:
            listed = c.get("/v1/streams").json()
            assert listed["total"] == len(everything) and "missing" not in listed, listed
            assert [s["config"]["name"] for s in listed["streams"]] == everything
            states = {s["config"]["name"]: s["state"] for s in listed["streams"]}
            assert [states[n]["messages"] for n in names] == [i + 1 for i in range(len(names))]
            page = c.get("/v1/streams", params={"offset": 2, "limit": 3}).json()
            assert (page["total"], page["offset"], page["limit"]) == (len(everything), 2, 3)
            assert [s["config"]["name"] for s in page["streams"]] == everything[2:5]
            only = c.get("/v1/streams", params={"subject": "v1.>"}).json()
            assert [s["config"]["name"] for s in only["streams"]] == ["V1"]
            bad = c.get("/v1/streams", params={"offset": -1})
            assert bad.status_code == 400 and bad.json()["error"]["err_code"] == 10003
            info = c.get("/v1/info").json()
            assert (info["streams"], info["consumers"]) == (len(everything), 2)
            assert info["storage"] == sum(s["state"]["bytes"] for s in listed["streams"])
            buckets = c.get("/v1/kv").json()
            assert [b["bucket"] for b in buckets["buckets"]] == ["kv_a", "kv_b"]


def _mixed(owners: dict[str, str]) -> tuple[list[str], list[str | None]]:
    """Subjects alternating between a stream of each gateway and one no stream captures, and the
    stream each should land in."""
    by_owner: dict[str, str] = {}
    for name, owner in sorted(owners.items()):
        by_owner.setdefault(owner, name)
    a, b = sorted(by_owner.values())
    subjects, streams = [], []
    for n in range(9):
        stream = (a, b, None)[n % 3]
        subjects.append(f"{stream.lower()}.s{n}" if stream else f"nowhere.s{n}")
        streams.append(stream)
    return subjects, streams


def test_a_batch_for_streams_of_both_gateways_is_split_by_owner(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=30.0) as c:
        owners = {f"V{i}": cluster.gateways[_owner(cluster, f"V{i}")] for i in range(24)
                  if c.get(f"/v1/streams/V{i}").status_code == 200}
    if len(set(owners.values())) < 2:
        with httpx.Client(base_url=cluster.url, timeout=30.0) as c:
            owners = _streams_on_both(cluster, c)
    subjects, streams = _mixed(owners)
    for gateway in sorted(set(cluster.gateways.values())):
        with httpx.Client(base_url=gateway, timeout=30.0) as c:
            single = c.post("/v1/publish", json={"messages": [{"subject": "nowhere.x", "text": "x"}]}).json()["acks"][0]
            last = {s: c.get(f"/v1/streams/{s}").json()["state"]["last_seq"] for s in streams if s}
            for body, content_type in (
                    (json.dumps({"messages": [{"subject": s, "text": s} for s in subjects]}).encode(),
                     "application/json"),
                    (binary_batch.encode([(s, s.encode(), None) for s in subjects]), binary_batch.MEDIA_TYPE)):
                acks = c.post("/v1/publish", content=body, headers={"content-type": content_type}).json()["acks"]
                assert len(acks) == len(subjects)
                for subject, stream, ack in zip(subjects, streams, acks, strict=True):
                    if stream is None:
                        assert ack == single, (subject, ack)
                        continue
                    last[stream] += 1
                    assert ack == {"stream": stream, "seq": last[stream]}, (subject, ack)
                    got = c.get(f"/v1/streams/{stream}/messages/{ack['seq']}").json()["message"]
                    assert got["subject"] == subject
