#!/usr/bin/env python3
"""Scale-out benchmark: JetLake on an S3 warehouse (versitygw on loopback), one and two gateway processes.

Run:  .venv/bin/python bench/scale.py [--quick]

Progress goes to stderr; one JSON line with every figure goes to stdout.
For one gateway, with the log on local disk (`--wal local`) and in the bucket (`--wal object`):
  ack_latency       p50/p99 ms of single publishes, one client, sequential (the PubAck follows the
                    log write: a local write, or the object PUT)
  publish           messages/s of batches of 100 from one client, and the gateway's CPU seconds per
                    1,000 messages (per-process CPU, so the figure reads on a shared 2-core machine)
  consume           messages/s of pulls of 100 each acknowledged
  log_puts_per_1000 object PUTs of the log per 1,000 messages published in batches of 100
                    (`--wal object`: one per group commit), counted from the objects in the bucket
  s3_requests_per_1000  every request the S3 server answered for this warehouse during the publish,
                    the consume and the flush that commits them to the tables (heartbeats and lease
                    renewals included), per 1,000 messages, by method: counted at the S3 server, from
                    versitygw's request log (one line per request, filtered by the warehouse's prefix)
  failover_s        `--wal object`: kill -9 of the gateway under no load, then a second gateway on an
                    empty disk: seconds from its start to its first PubAck (includes process start)
`cluster`: `--cluster --wal object` gateways on one warehouse, four streams, two client threads each
publishing (then pulling and acking) through the owner of its streams; first one gateway process, then
two (the second joins and takes its rendezvous share): messages/s, each process's CPU seconds (busy
share of a core = cpu_s / wall_s, so the scaling on 2 cores reads apart from the clients' own CPU),
S3 requests per 1,000 messages, and `failover_s`: kill -9 of the second gateway, seconds until a
stream it owned takes a publish again through the first (heartbeat TTL + a round, under load of none).
Beside them `published`: Bufstream p50 260 ms / p99 500 ms, WarpStream p99 ~400 ms (their docs).
Every loop has a fixed count; waits have deadlines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cluster.rendezvous import owner_of  # noqa: E402
from engine.store.layout import Layout  # noqa: E402
from engine.store.objectstore import WarehouseLocation  # noqa: E402
from tests.gateway import Gateway  # noqa: E402
from tests.s3 import BUCKET, S3Server, versitygw_binary  # noqa: E402

PUBLISHED = {"bufstream": {"p50_ms": 260, "p99_ms": 500}, "warpstream": {"p99_ms": 400}}
STREAM = "BENCH"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(ordered[len(ordered) // 2] * 1e3, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RequestLog:
    """The S3 server's requests for one warehouse, from versitygw's request log (a line per request:
    `time | vgw | status | duration | client | METHOD | /bucket/key | ...`)."""

    def __init__(self, s3: S3Server, warehouse: str) -> None:
        self.path = s3.log
        self.prefix = f"/{BUCKET}/{warehouse.split('/', 3)[3]}/"

    def mark(self) -> int:
        return self.path.stat().st_size

    def since(self, mark: int) -> Counter[str]:
        with open(self.path, "rb") as log:
            log.seek(mark)
            lines = log.read().decode("utf-8", "replace").splitlines()
        methods: Counter[str] = Counter()
        for line in lines:
            fields = [f.strip() for f in line.split("|")]
            if len(fields) > 6 and fields[1] == "vgw" and fields[6].startswith(self.prefix):
                methods[fields[5]] += 1
        return methods


def _per_1000(methods: Counter[str], messages: int) -> dict[str, float]:
    out = {method: round(n / messages * 1000, 1) for method, n in sorted(methods.items())}
    return {"total": round(sum(methods.values()) / messages * 1000, 1), **out}


def _gateway(s3: S3Server, warehouse: str, wal: str, state: Path) -> Gateway:
    state.mkdir(parents=True, exist_ok=True)
    return Gateway(warehouse, "--wal", wal, "--wal-dir", str(state), "--flush-interval", "600",
                   "--nats-port", "0", env=s3.env, log_dir=state)


def _measure(s3: S3Server, wal: str, root: Path, singles: int, batches: int) -> dict[str, object]:
    warehouse = s3.warehouse(f"bench-{wal}-{int(time.time())}")
    location = WarehouseLocation.parse(warehouse, s3.env)
    gw = _gateway(s3, warehouse, wal, root / wal / "one").start(timeout=120)
    requests = RequestLog(s3, warehouse)
    figures: dict[str, object] = {}
    try:
        assert gw.proc is not None
        with httpx.Client(base_url=gw.url, timeout=30.0) as c:
            c.post("/v1/streams", json={"name": STREAM, "subjects": ["bench.>"]}).raise_for_status()
            consumer = {"durable_name": "C", "ack_policy": "explicit"}
            c.post(f"/v1/streams/{STREAM}/consumers", json=consumer).raise_for_status()
            samples = []
            for i in range(singles):
                began = time.perf_counter()
                c.post("/v1/publish/bench.one", content=b"x" * 100).raise_for_status()
                samples.append(time.perf_counter() - began)
            figures["ack_latency"] = _percentiles(samples)
            _say(f"{wal}: ack latency {figures['ack_latency']}")
            c.post("/v1/flush").raise_for_status()  # the single publishes leave the log
            body = {"messages": [{"subject": f"bench.{i % 4}", "text": "y" * 100} for i in range(100)]}
            mark = requests.mark()
            cpu, began = _cpu_seconds(gw.proc.pid), time.perf_counter()
            for _ in range(batches):
                c.post("/v1/publish", json=body).raise_for_status()
            seconds, used = time.perf_counter() - began, _cpu_seconds(gw.proc.pid) - cpu
            messages = 100 * batches
            figures["publish"] = {"msgs_per_s": round(messages / seconds),
                                  "gateway_cpu_s_per_1000": round(used / messages * 1000, 4)}
            puts = sum(1 for m in location.open().list(f"default/_log/{STREAM}") if m.key.endswith(".wal"))
            figures["log_puts_per_1000"] = round(puts / messages * 1000, 2) if wal == "object" else 0
            _say(f"{wal}: publish {figures['publish']}, log PUTs per 1000: {figures['log_puts_per_1000']}")
            began, got = time.perf_counter(), 0
            while got < messages:
                pull = {"batch": 100, "no_wait": True}
                msgs = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json=pull).json()["messages"]
                if not msgs:
                    break
                c.post(f"/v1/streams/{STREAM}/consumers/C/ack", json={"acks": [{"token": m["ack"]} for m in msgs]})
                got += len(msgs)
            figures["consume"] = {"msgs_per_s": round(got / (time.perf_counter() - began)), "messages": got}
            _say(f"{wal}: consume {figures['consume']}")
            c.post("/v1/flush").raise_for_status()
            figures["s3_requests_per_1000"] = _per_1000(requests.since(mark), messages)
            _say(f"{wal}: S3 requests per 1000 messages {figures['s3_requests_per_1000']}")
        if wal == "object":
            gw.kill9()
            second = _gateway(s3, warehouse, wal, root / wal / "two")
            began = time.perf_counter()
            second.start(timeout=120)
            try:
                with httpx.Client(base_url=second.url, timeout=30.0) as c:
                    c.post("/v1/publish/bench.after", content=b"z").raise_for_status()
                figures["failover_s"] = round(time.perf_counter() - began, 2)
            finally:
                second.stop()
            _say(f"{wal}: failover {figures['failover_s']} s")
    finally:
        gw.stop()
    return figures


CLUSTER_STREAMS = [f"C{i}" for i in range(8)]
CLIENTS = 2


def _cluster_gateway(s3: S3Server, warehouse: str, state: Path) -> Gateway:
    state.mkdir(parents=True, exist_ok=True)
    return Gateway(warehouse, "--cluster", "--wal", "object", "--wal-dir", str(state), "--flush-interval", "600",
                   env=s3.env, log_dir=state)


def _owners(location: WarehouseLocation, gateway: Gateway) -> dict[str, str]:
    """Each stream's owner (HTTP address), from its lease and the members' records."""
    store = location.open()
    layout = Layout(location)
    with gateway.client() as c:
        members = {m["id"]: m["http"] for m in c.get("/v1/cluster").json()["gateways"]}
    out = {}
    for stream in CLUSTER_STREAMS:
        holder = json.loads(store.get(layout.stream_lease_key(stream)).data)["owner"]
        out[stream] = members.get(holder, gateway.url)
    return out


def _settled(location: WarehouseLocation, gateway: Gateway) -> bool:
    """Every stream held by the gateway rendezvous hashing gives it to, over the live members."""
    with gateway.client() as c:
        members = {m["http"]: m["id"] for m in c.get("/v1/cluster").json()["gateways"]}
    owners = _owners(location, gateway)
    return len(members) == 2 and all(
        members.get(url) == owner_of(f"default/{stream}", set(members.values())) for stream, url in owners.items())


def _clients(work: list[list[str]], task: Callable[[list[str]], None]) -> float:
    """Runs `task(streams)` on one thread per share of the streams; returns the wall seconds."""
    threads = [threading.Thread(target=task, args=(share,)) for share in work]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def _load(gateways: list[Gateway], location: WarehouseLocation, requests: RequestLog,
          batches: int) -> dict[str, object]:
    """Publish then consume through the owners, CLIENTS threads; figures per gateway process."""
    owners = _owners(location, gateways[0])
    shares = [CLUSTER_STREAMS[i::CLIENTS] for i in range(CLIENTS)]
    body = {"messages": [{"subject": "x", "text": "y" * 100} for _ in range(100)]}

    def publish(streams: list[str]) -> None:
        clients = {url: httpx.Client(base_url=url, timeout=60.0) for url in set(owners.values())}
        for n in range(batches):
            stream = streams[n % len(streams)]
            messages = [{**m, "subject": f"{stream.lower()}.x"} for m in body["messages"]]
            answer = clients[owners[stream]].post("/v1/publish", json={"messages": messages})
            answer.raise_for_status()
            acked[stream] = acked.get(stream, 0) + sum(1 for ack in answer.json()["acks"] if "seq" in ack)
        for client in clients.values():
            client.close()

    def consume(streams: list[str]) -> None:
        with httpx.Client(timeout=60.0) as c:
            for stream in streams:
                base = f"{owners[stream]}/v1/streams/{stream}/consumers/C"
                empty = 0
                while consumed.get(stream, 0) < acked.get(stream, 0) and empty < 100:  # bounded: ~5 s idle
                    msgs = c.post(f"{base}/next", json={"batch": 100, "no_wait": True}).json().get("messages", [])
                    if not msgs:
                        empty += 1
                        time.sleep(0.05)
                        continue
                    c.post(f"{base}/ack", json={"acks": [{"token": m["ack"]} for m in msgs]}).raise_for_status()
                    consumed[stream] = consumed.get(stream, 0) + len(msgs)

    consumed: dict[str, int] = {}
    acked: dict[str, int] = {}
    pids = [g.proc.pid for g in gateways if g.proc is not None]
    mark = requests.mark()
    cpu = [_cpu_seconds(pid) for pid in pids]
    wall = _clients(shares, publish)
    messages = sum(acked.values())
    cpu_publish = [round(_cpu_seconds(pid) - c0, 2) for pid, c0 in zip(pids, cpu, strict=True)]
    figures: dict[str, object] = {"publish": {
        "msgs_per_s": round(messages / wall), "wall_s": round(wall, 2), "cpu_s_per_process": cpu_publish,
        "busy_cores_per_process": [round(c / wall, 2) for c in cpu_publish]}}
    cpu = [_cpu_seconds(pid) for pid in pids]
    wall = _clients(shares, consume)
    cpu_consume = [round(_cpu_seconds(pid) - c0, 2) for pid, c0 in zip(pids, cpu, strict=True)]
    got = sum(consumed.values())
    figures["publish"]["acked"] = messages  # type: ignore[index]
    figures["consume"] = {"msgs_per_s": round(got / wall), "messages": got, "cpu_s_per_process": cpu_consume,
                          "busy_cores_per_process": [round(c / wall, 2) for c in cpu_consume]}
    for gateway in gateways:
        with gateway.client() as c:
            c.post("/v1/flush").raise_for_status()
    figures["s3_requests_per_1000"] = _per_1000(requests.since(mark), messages)
    figures["streams_per_process"] = [sum(1 for o in owners.values() if o == g.url) for g in gateways]
    return figures


def _cluster(s3: S3Server, root: Path, batches: int) -> dict[str, object]:
    warehouse = s3.warehouse(f"bench-cluster-{int(time.time())}")
    location = WarehouseLocation.parse(warehouse, s3.env)
    requests = RequestLog(s3, warehouse)
    gateways = [_cluster_gateway(s3, warehouse, root / "cluster" / "a").start(timeout=120)]
    figures: dict[str, object] = {}
    try:
        with gateways[0].client() as c:
            for stream in CLUSTER_STREAMS:
                c.post("/v1/streams", json={"name": stream, "subjects": [f"{stream.lower()}.>"]}).raise_for_status()
                made = c.post(f"/v1/streams/{stream}/consumers", json={"durable_name": "C", "ack_policy": "explicit"})
                made.raise_for_status()
        figures["one_process"] = _load(gateways, location, requests, batches)
        _say(f"cluster, one process: {figures['one_process']}")
        gateways.append(_cluster_gateway(s3, warehouse, root / "cluster" / "b").start(timeout=120))
        deadline = time.monotonic() + 120
        while not _settled(location, gateways[0]):  # the newcomer takes its rendezvous share
            if time.monotonic() > deadline:
                raise TimeoutError("the streams did not settle on the two gateways")
            time.sleep(0.2)
        figures["two_processes"] = _load(gateways, location, requests, batches)
        _say(f"cluster, two processes: {figures['two_processes']}")
        moved = next(s for s, o in _owners(location, gateways[0]).items() if o == gateways[1].url)
        gateways[1].kill9()
        began = time.perf_counter()
        with gateways[0].client() as c:
            while c.post(f"/v1/publish/{moved.lower()}.after", content=b"z").status_code != 200:
                if time.perf_counter() - began > 120:
                    raise TimeoutError(f"stream {moved} not served again within 120 s")
                time.sleep(0.05)
        figures["failover_s"] = round(time.perf_counter() - began, 2)
        _say(f"cluster: failover {figures['failover_s']} s")
    finally:
        for gateway in gateways:
            if gateway.proc is not None and gateway.proc.poll() is None:
                gateway.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few messages")
    args = parser.parse_args()
    binary = versitygw_binary()
    if binary is None:
        sys.exit("the S3 server (versitygw) is not installed: run scripts/setup.sh")
    singles, batches = (50, 20) if args.quick else (500, 200)
    with tempfile.TemporaryDirectory(prefix="jetlake-scale-") as tmp:
        root = Path(tmp)
        (root / "s3").mkdir()
        s3 = S3Server(root / "s3", binary).start()
        try:
            result = {"bench": "scale", "published": PUBLISHED,
                      **{wal: _measure(s3, wal, root, singles, batches) for wal in ("local", "object")},
                      "cluster": _cluster(s3, root, batches // 2)}
        finally:
            s3.stop()
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
