"""`jetlake`: the command line.

- `serve` runs the gateway and, unless `--no-scheduler`, the jobs scheduler beside it (a child process);
- `jobs run retention|erase|compact|all` runs maintenance jobs once;
- `scheduler` runs them on intervals;
- `sql "<query>"` queries every stream (and KV bucket) with Spark SQL;
- `accounts delete` and `keys rotate` are the operator's commands (api/operator_cli.py).

Only the Spark subcommands import pyspark and `jobs`, inside their functions: the gateway never loads
the JVM.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import decimal
import gc
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from api import operator_cli
from engine import EngineOptions, heap
from engine.accounts.config import ConfigError, ServerConfig
from engine.accounts.config import load as load_config
from engine.accounts.registry import Accounts
from engine.encryption import master_keys
from engine.keys import KeyringError
from engine.options import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL
from engine.backpressure import DEFAULT_MAX_PENDING_BYTES
from engine.store.delta import DEFAULT_CACHE_BYTES
from engine.store.backlog import DEFAULT_MAX_LOG_BYTES, DEFAULT_MAX_TOTAL_BYTES
from engine.store.layout import DEFAULT_ACCOUNT
from engine.store.lease import OwnerLockedError
from engine.store.objectstore import ObjectStoreError, WarehouseLocation
from engine.messages import DEFAULT_MAX_PAYLOAD

log = logging.getLogger("jetlake")

DEFAULT_NATS_PORT = 4222


def _nats_door_refusal(args: argparse.Namespace) -> str | None:
    """The NATS door serves only the streams of its own process: with several gateways it would answer
    for the others' streams as if they did not exist, so it is off there, and asking for it is refused.
    Sets `args.nats_port` (default 4222 for one gateway, 0 with --cluster or --workers)."""
    several = args.cluster or args.workers > 1
    if args.nats_port is None:
        args.nats_port = 0 if several else DEFAULT_NATS_PORT
    elif several and args.nats_port:
        return ("--nats-port cannot be used with --cluster or --workers: the NATS door does not forward to the "
                "gateway owning a stream yet; use the HTTP API (any gateway serves every stream), or one gateway")
    return None


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Importing the HTTP app builds its routes' pydantic models: hundreds of thousands of objects that live
    as long as the process. The cyclic collector walks them again and again as they pile up and frees
    nothing, a tenth of that import's CPU; it is paused meanwhile and left as it was found."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _serve(args: argparse.Namespace) -> int:
    refusal = _nats_door_refusal(args)
    if refusal:
        print(f"jetlake: {refusal}", file=sys.stderr)
        return 2
    if args.workers > 1:
        from api.workers import supervise

        return supervise(args.argv[args.argv.index("serve") + 1:], args.workers, args.host)

    with _collection_paused():
        import uvicorn

        from api.auth import Authenticator
        from api.http.app import create_app
        from api.http.tls import settings as tls_settings

    heap.keep_freed_memory()
    try:
        config = load_config(args.config) if args.config else ServerConfig.open()
        tls = tls_settings(config.tls, args.tls_cert, args.tls_key, args.tls_ca, args.tls_verify, args.tls_map)
        for account in config.accounts.values():
            master_keys(config.jetstream, account)  # an empty key or an unknown cipher is a config error
    except (ConfigError, ValueError) as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings:
        log.warning("config: %s", warning)
    if config.tls is not None and config.tls.min_version == "1.3":
        log.warning("config: tls min_version 1.3 is not applied: the gateway accepts TLS 1.2 and 1.3")
    authenticator = Authenticator(config)
    refusal = _exposure_refusal(args.host, authenticator.required, tls is not None and tls.verify)
    if not refusal and args.nats_port:  # the NATS door has no TLS: only credentials protect it off loopback
        refusal = _exposure_refusal(args.nats_host or args.host, authenticator.required, False)
    if refusal:
        print(f"jetlake: {refusal}", file=sys.stderr)
        return 2
    if config.no_auth_user and not _is_loopback(args.host):
        log.warning("no_auth_user %r: requests without credentials act as that user", config.no_auth_user)
    sync = args.sync or ("always" if config.jetstream.sync_always else "os")
    options = EngineOptions(
        sync_always=sync == "always",
        flush_interval=args.flush_interval,
        flush_bytes=args.flush_bytes,
        max_payload=args.max_payload,
        max_unflushed_bytes=args.max_unflushed_bytes,
        max_unflushed_total=args.max_unflushed_total,
        max_pending_bytes=args.max_pending_bytes,
        cache_bytes=args.cache_bytes,
        wal_dir=args.wal_dir,
        wal=args.wal,
        takeover_wait=args.takeover_wait,
        cluster=args.cluster,
    )
    if args.cluster and args.wal != "object":
        print("jetlake: --cluster needs --wal object (a stream's log must be readable by the gateway taking it over)",
              file=sys.stderr)
        return 2
    try:
        warehouse = WarehouseLocation.parse(args.warehouse or config.jetstream.store_dir or "./warehouse")
    except ValueError as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    accounts = Accounts(warehouse, options, config)
    try:
        accounts.open()
        heap.collect_rarely()
    except (OwnerLockedError, KeyringError, ObjectStoreError) as exc:  # a wrong or missing key: nothing was written
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    log.info(
        "serving warehouse %s on %s://%s:%d (accounts %s; authentication %s; sync %s, flush every %.2fs)",
        warehouse.uri(), "https" if tls else "http", args.host, args.port, ", ".join(accounts.names()),
        "required" if authenticator.required else "off", sync, args.flush_interval,
    )
    doors = []
    if args.nats_port:
        from api.nats.server import NatsServer

        doors.append(NatsServer(accounts, args.nats_host or args.host, args.nats_port, auth=authenticator,
                                max_payload=args.max_payload))
    cluster = _start_cluster(accounts, args) if args.cluster else None
    scheduler = _SchedulerChild(warehouse.uri(), args.spark_master) if args.scheduler else None
    if scheduler is not None:
        scheduler.start()
        # uvicorn re-raises a captured SIGTERM after its shutdown, which would end this process before
        # the `finally` below: stop the child first, then die of the signal as before.
        def _stop_scheduler_then_exit(signum: int, _frame: Any) -> None:
            scheduler.stop()
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

        signal.signal(signal.SIGTERM, _stop_scheduler_then_exit)
    try:
        app = create_app(accounts, authenticator, max_body=args.max_body, config_path=args.config, doors=doors,
                         cluster=cluster)
        options: dict[str, Any] = dict(log_level=args.log_level, access_log=False, loop="uvloop",
                                       timeout_graceful_shutdown=5,
                                       **(tls.uvicorn_options() if tls else {"http": "httptools"}))
        if args.internal_port:  # a worker of `--workers N`: the shared public port and its own
            from api.workers import listening_socket, reuse_port_socket

            sockets = [reuse_port_socket(args.host, args.port), listening_socket(args.host, args.internal_port)]
            uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=sockets)
        else:
            uvicorn.run(app, host=args.host, port=args.port, **options)
    finally:
        if scheduler is not None:
            scheduler.stop()
        accounts.close()
        log.info("gateway stopped; every stream flushed")
    return 0


def _start_cluster(accounts: Any, args: argparse.Namespace) -> Any:
    """Joins the gateways serving the warehouse (engine/cluster/): heartbeat, stream leases, forwarding."""
    from engine.cluster.membership import Member
    from engine.cluster.service import for_accounts
    from engine.store.lease import holder_id

    http = args.advertise or f"http://{args.host}:{args.internal_port or args.port}"
    nats = f"nats://{args.nats_host or args.host}:{args.nats_port}" if args.nats_port else ""
    cluster = for_accounts(accounts, Member(holder_id(), http, nats))
    cluster.start()
    log.info("cluster: gateway %s advertised at %s; %d streams owned here", cluster.membership.me.id, http,
             len(cluster.ownership.held))
    return cluster


def _is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _exposure_refusal(host: str, auth_required: bool, client_certs_required: bool) -> str | None:
    """Why the gateway must not bind `host`: anonymous access is for loopback only."""
    if auth_required or client_certs_required or _is_loopback(host):
        return None
    return (
        f"refusing to serve on {host} without authentication: anyone who can reach the port could read, "
        "change and delete every stream. Give --config FILE with users or a token (see README, \"Security\"), "
        "or --tls-verify with --tls-ca to require client certificates, or serve on 127.0.0.1."
    )


class _SchedulerChild:
    """`serve` (without `--no-scheduler`): `jetlake scheduler` as a child process, restarted (with a backoff) if it fails.

    A child process, not a thread: the jobs drive a JVM through py4j and pull results into Python;
    in the gateway's process that would load the JVM bridge and compete with the publish path for the
    GIL and memory, and a JVM crash or out-of-memory would take the gateway with it. The child gets
    `--parent-pid` and stops when the gateway is gone, even after a kill -9; the gateway stops it by
    its PID on shutdown (SIGTERM, then SIGKILL after a grace period).
    """

    GRACE = 20.0

    def __init__(self, warehouse: str, master: str | None) -> None:
        self.cmd = [sys.executable, "-m", "api.cli", "scheduler", "--warehouse", str(warehouse),
                    "--parent-pid", str(os.getpid())]
        if master:
            self.cmd += ["--master", master]
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, name="jetlake-scheduler-supervisor", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            # Its own session: a terminal's Ctrl-C reaches the gateway, which then stops the child in order.
            self.proc = subprocess.Popen(self.cmd, start_new_session=True)
        log.info("scheduler started beside the gateway (pid %d)", self.proc.pid)

    def _supervise(self) -> None:
        backoff = 5.0
        while not self._stopping.is_set():
            proc = self.proc
            if proc is None:
                return
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            if code == 0:
                log.info("scheduler (pid %d) finished (nothing left to run)", proc.pid)
                return
            if time.monotonic() - started > 300:
                backoff = 5.0
            log.warning("scheduler (pid %d) exited with %s; restarting in %.0fs", proc.pid, code, backoff)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, 300.0)
            self._spawn()

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.info("scheduler (pid %d) stopped", proc.pid)


# -- Spark subcommands: pyspark and jobs are imported inside them only ----------------------------


def _jobs_run(args: argparse.Namespace) -> int:
    """Runs the job(s) on every account of the warehouse (or the one `--account` names); one JSON
    line of figures per job and account."""
    from engine.store.layout import Layout, account_names
    from jobs.scheduler import JOBS, JobMissing, run_job
    from jobs.spark import spark_session

    names = list(JOBS) if args.job == "all" else [args.job]
    accounts = [args.account] if args.account else account_names(args.warehouse) or [DEFAULT_ACCOUNT]
    options = _job_options(args)
    keyrings = {account: _keyring(args, Layout(args.warehouse, account, args.wal_dir)) for account in accounts}
    if any(k is False for k in keyrings.values()):
        return 2  # a wrong key refuses the run before Spark starts
    spark = spark_session(args.master, app_name=f"jetlake-jobs-{args.job}", warehouse=args.warehouse)
    status = 0
    try:
        for account in accounts:
            layout = Layout(args.warehouse, account, args.wal_dir)
            for name in names:
                try:
                    extra = {"keyring": keyrings[account]} if name == "compact" and keyrings[account] else {}
                    figures = run_job(spark, layout, name, **options.get(name, {}), **extra)  # compact re-encrypts
                except JobMissing as exc:
                    log.warning("%s; skipped", exc)
                    if args.job != "all":
                        status = 2
                    continue
                except Exception:
                    log.exception("job %s failed on account %s", name, account)
                    status = 1
                    continue
                print(json.dumps({"job": name, "account": account, **figures}), flush=True)
    finally:
        spark.stop()
    return status


def _scheduler(args: argparse.Namespace) -> int:
    from engine.store.layout import Layout
    from jobs.scheduler import Scheduler, intervals_from, start_delay_from
    from jobs.spark import spark_session

    try:
        intervals = intervals_from(
            {"retention": args.retention_interval, "compact": args.compact_interval, "erase": args.erase_interval}
        )
        start_delay = start_delay_from(args.start_delay)
    except ValueError as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    scheduler = Scheduler(
        spark=lambda: spark_session(args.master, app_name="jetlake-scheduler", warehouse=args.warehouse),
        layout=Layout(args.warehouse, wal_dir=args.wal_dir),
        intervals=intervals,
        all_accounts=True,
        options=_job_options(args),
        max_runs=args.max_runs,
        duration=args.duration,
        start_delay=start_delay,
    )
    signals = {"count": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            log.warning("scheduler: second %s, exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)  # the JVM child exits when our pipe to it closes
        log.info("scheduler: %s, stopping after the current job", signal.Signals(signum).name)
        scheduler.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, scheduler), daemon=True).start()
    failures = scheduler.run_forever()
    return 1 if failures and args.max_runs is not None else 0


def _job_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per-job options from the command line: the vacuum window of the jobs that vacuum."""
    if args.vacuum_window is None:
        return {}
    return {name: {"vacuum_window": args.vacuum_window} for name in ("retention", "compact")}


def _watch_parent(parent: int, scheduler: Any) -> None:
    """Stops the scheduler once the process that started it (the gateway) is gone."""
    while not scheduler.stopped:
        if os.getppid() != parent:
            log.warning("scheduler: parent process %d is gone, stopping", parent)
            scheduler.stop()
            return
        time.sleep(1.0)


def _sql(args: argparse.Namespace) -> int:
    if not args.no_flush:
        _ask_gateway_to_flush(args.gateway, args.token or os.environ.get("JETLAKE_TOKEN"))

    from pyspark.errors import PySparkException

    from engine.store.layout import Layout
    from jobs.spark import spark_session
    from jobs.sql import register_views

    layout = Layout(args.warehouse, args.account, args.wal_dir)
    keyring = _keyring(args, layout)
    if keyring is False:
        return 2
    spark = spark_session(args.master, app_name="jetlake-sql", warehouse=args.warehouse)
    try:
        register_views(spark, layout, keyring)
        try:
            df = spark.sql(args.query)
            columns = list(df.columns)
            rows = df.collect() if args.format == "table" else df.toLocalIterator()
            _print_rows(columns, rows, args.format, sys.stdout)
        except PySparkException as exc:
            print(f"jetlake sql: {exc}", file=sys.stderr)
            return 1
    finally:
        spark.stop()
    return 0


def _keyring(args: argparse.Namespace, layout: Any) -> Any:
    """The account's keyring for a Spark command (`--config`'s `jetstream { key }`, else $JETLAKE_KEY):
    None when the account has none or no key is given; False (after saying why) when the key is wrong."""
    from engine.accounts.config import AccountConfig
    from engine.encryption import existing_keyring

    try:
        config = load_config(args.config) if args.config else ServerConfig.open()
        account = config.accounts.get(layout.account) or AccountConfig(layout.account)
        return existing_keyring(layout, master_keys(config.jetstream, account)[0])
    except (ConfigError, ValueError, KeyringError) as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return False


def _ask_gateway_to_flush(gateway: str, token: str | None = None) -> None:
    """Every message acknowledged before now reaches its table: the gateway commits its logs.

    No gateway answering means none runs on this machine's port: a stopped gateway flushed everything
    at shutdown. A gateway that answers with an error is reported, and the query runs anyway.
    """
    url = gateway.rstrip("/") + "/v1/flush"
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read() or b"{}")
        log.info("gateway %s flushed: %s commits", gateway, answer.get("commits"))
    except urllib.error.HTTPError as exc:
        print(f"jetlake sql: warning: {url} answered {exc.code}; messages still in its log may be missing",
              file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        log.info("no gateway at %s (%s): reading what is flushed", gateway, getattr(exc, "reason", exc))


def _plain(value: Any) -> Any:
    """A Spark value as JSON-friendly Python: binary as base64, times as RFC 3339 UTC."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.datetime):
        # PySpark hands timestamps over as naive local time; astimezone() reads naive as local.
        return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):  # a struct
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    plain = _plain(value)
    if isinstance(plain, dict | list):
        return json.dumps(plain, ensure_ascii=False, separators=(",", ":"))
    if isinstance(plain, bool):
        return "true" if plain else "false"
    return str(plain)


def _print_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]], fmt: str, out: TextIO) -> None:
    """table: aligned text and a row count; json: one object per line; csv: a header line, then rows."""
    if fmt == "json":
        for row in rows:
            out.write(json.dumps(dict(zip(columns, (_plain(v) for v in row), strict=True)),
                                 ensure_ascii=False) + "\n")
        return
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else _cell(v) for v in row])
        return
    cells = [[_cell(v).replace("\n", "\\n") for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(rule + "\n")
    out.write("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |\n")
    out.write(rule + "\n")
    for r in cells:
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |\n")
    if cells:
        out.write(rule + "\n")
    out.write(f"({len(cells)} row{'s' if len(cells) != 1 else ''})\n")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetlake", description="NATS JetStream's model on Delta Lake tables")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    serve.add_argument("--warehouse", default=None,
                       help="warehouse: a folder (default: the config's jetstream { store_dir }, then ./warehouse) "
                            "or s3://bucket/prefix (endpoint and credentials from AWS_* variables)")
    serve.add_argument("--wal", choices=("local", "object"), default="local",
                       help="where the write-ahead log lives: 'local' (--wal-dir) or 'object' (the warehouse's store, "
                            "one object per group commit; the ack follows the PUT, another gateway can take over)")
    serve.add_argument("--takeover-wait", type=float, default=0.0, metavar="S",
                       help="wait up to S seconds for the gateway owning the warehouse to go (its lease to "
                            "expire) instead of refusing to start: a standby gateway")
    serve.add_argument("--cluster", action="store_true",
                       help="serve the warehouse with other gateways: each stream is owned by one of them (a lease "
                            "per stream), any gateway forwards a request to the owner; needs --wal object")
    serve.add_argument("--advertise", default=None, metavar="URL",
                       help="with --cluster: the HTTP address other gateways reach this one at "
                            "(default http://<host>:<port>)")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="run N gateway processes on this machine sharing --port (SO_REUSEPORT), each owning "
                            "a share of the streams as with --cluster (implies --cluster --wal object; no NATS door)")
    serve.add_argument("--internal-port", type=int, default=0, help=argparse.SUPPRESS)  # a worker's own port
    serve.add_argument("--wal-dir", default=None, metavar="DIR",
                       help="local folder of the write-ahead logs (default: the warehouse folder; for an s3:// "
                            "warehouse ./jetlake-state). Its streams wait for this gateway to return if it dies")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind; other than loopback only with authentication configured")
    serve.add_argument("--port", type=int, default=4280)
    serve.add_argument("--config", default=None, metavar="FILE",
                       help="nats-server config file: accounts, users, permissions, limits, tls (SIGHUP reloads it)")
    serve.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS with this certificate (chain)")
    serve.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    serve.add_argument("--tls-ca", default=None, metavar="PEM", help="CA certificates that sign client certificates")
    serve.add_argument("--tls-verify", action="store_true", help="require a client certificate signed by --tls-ca")
    serve.add_argument("--tls-map", action="store_true",
                       help="the client certificate names the user (nats-server's verify_and_map); implies --tls-verify")
    serve.add_argument(
        "--sync", choices=("os", "always"), default=None,
        help="write-ahead log sync policy, as JetStream's sync_interval: 'os' lets the OS flush, 'always' fsyncs each batch",
    )
    serve.add_argument("--flush-interval", type=_positive_float, default=DEFAULT_FLUSH_INTERVAL,
                       help="seconds between commits of each stream's log to its Delta table")
    serve.add_argument("--flush-bytes", type=int, default=DEFAULT_FLUSH_BYTES,
                       help="commit a stream early once this many bytes wait in its log")
    serve.add_argument("--nats-port", type=int, default=None,
                       help=f"port for NATS clients (the nats CLI, nats.go, nats.py; default {DEFAULT_NATS_PORT}); "
                            "0 turns the NATS door off. Refused with --cluster or --workers (the door does not "
                            "forward to other gateways), where it is off")
    serve.add_argument("--nats-host", default=None, help="address for NATS clients (default: --host)")
    serve.add_argument("--max-unflushed-bytes", type=_positive_int, default=DEFAULT_MAX_LOG_BYTES,
                       help="bound of each log (a stream's, the ack log) not yet committed to its table; past it "
                            "publishes (acks) get a 503 until the flusher catches up")
    serve.add_argument("--max-unflushed-total", type=_positive_int, default=DEFAULT_MAX_TOTAL_BYTES,
                       help="bound of all the gateway's logs together; past it every publish and ack gets a 503")
    serve.add_argument("--max-pending-bytes", type=_positive_int, default=DEFAULT_MAX_PENDING_BYTES,
                       help="bound of each stream's messages held in memory until their commit; past it publishes "
                            "wait for the commit under way (the flusher is woken at half of it)")
    serve.add_argument("--cache-bytes", type=_positive_int, default=DEFAULT_CACHE_BYTES,
                       help="bound of each stream's copies of recently committed messages (and half of it for its "
                            "index's row details); they go once a write load ends")
    serve.add_argument("--max-payload", type=int, default=DEFAULT_MAX_PAYLOAD, help="largest message (headers + data)")
    serve.add_argument("--max-body", type=int, default=64 * 1024 * 1024, help="largest request body; larger is 413")
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    serve.add_argument("--scheduler", dest="scheduler", action="store_true", default=True,
                       help="run the jobs scheduler beside the gateway (the default: a child process, local Spark; "
                            "intervals from JETLAKE_*_INTERVAL), so that limits and purges free disk")
    serve.add_argument("--no-scheduler", dest="scheduler", action="store_false",
                       help="do not run the scheduled jobs (tests, benchmarks, or a scheduler run elsewhere)")
    serve.add_argument("--spark-master", default=None,
                       help="Spark master for the scheduler's jobs (default $JETLAKE_SPARK_MASTER, then local[*])")
    serve.set_defaults(func=_serve)

    jobs = commands.add_parser("jobs", help="run maintenance jobs once")
    jobs_commands = jobs.add_subparsers(dest="jobs_command", required=True)
    run = jobs_commands.add_parser("run", help="run retention, erase, compact, or all three in that order")
    run.add_argument("job", choices=("retention", "compact", "erase", "all"))
    _spark_options(run)
    run.add_argument("--account", default=None, help="only this account (default: every account of the warehouse)")
    _vacuum_option(run)
    run.add_argument("--config", default=None, metavar="FILE", help="the gateway's config file (its encryption keys)")
    run.set_defaults(func=_jobs_run)

    scheduler = commands.add_parser("scheduler", help="run the maintenance jobs on intervals")
    _spark_options(scheduler)
    _vacuum_option(scheduler)
    for name in ("retention", "erase", "compact"):
        scheduler.add_argument(f"--{name}-interval", type=_seconds, default=None, metavar="S",
                               help=f"seconds between {name} runs, 0 = off (default $JETLAKE_{name.upper()}_INTERVAL, "
                                    f"then {int(_DEFAULT_INTERVALS[name])})")
    scheduler.add_argument("--start-delay", type=_seconds, default=None, metavar="S",
                           help="seconds before the first runs (default $JETLAKE_SCHEDULER_START_DELAY, then 0)")
    scheduler.add_argument("--max-runs", type=int, default=None, help="stop after this many job runs")
    scheduler.add_argument("--duration", type=_seconds, default=None, help="stop after this many seconds")
    scheduler.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    scheduler.set_defaults(func=_scheduler)

    sql = commands.add_parser("sql", help="query the streams with Spark SQL (each stream is a table)")
    sql.add_argument("query")
    _spark_options(sql, log_level="warning")
    sql.add_argument("--format", choices=("table", "json", "csv"), default="table",
                     help="table (default), json (one object per line; binary as base64), csv")
    sql.add_argument("--gateway", default="http://127.0.0.1:4280",
                     help="gateway to flush first, so every acknowledged message is in the tables")
    sql.add_argument("--no-flush", action="store_true", help="do not ask a gateway to flush first")
    sql.add_argument("--account", default=DEFAULT_ACCOUNT, help="the account whose streams are the tables (default: default)")
    sql.add_argument("--config", default=None, metavar="FILE",
                     help="the gateway's config file: with its `jetstream { key }` encrypted streams are decrypted")
    sql.add_argument("--token", default=None,
                     help="bearer token for the gateway's flush (default $JETLAKE_TOKEN); it flushes that user's account")
    sql.set_defaults(func=_sql)
    operator_cli.add_commands(commands)
    return parser


LOG_LEVELS = ("debug", "info", "warning", "error")
# The scheduler's defaults, repeated here for --help only (jobs/ is not imported before a Spark command runs).
_DEFAULT_INTERVALS = {"retention": 300.0, "erase": 60.0, "compact": 3600.0}


def _vacuum_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vacuum-window", type=_hours, default=None, metavar="HOURS",
                        help="retention and compact delete replaced data files this many hours after they were "
                             "replaced (default $JETLAKE_VACUUM_WINDOW_HOURS, then 1)")


def _spark_options(parser: argparse.ArgumentParser, log_level: str = "info") -> None:
    parser.add_argument("--warehouse", default="./warehouse", help="warehouse folder (default ./warehouse)")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default $JETLAKE_SPARK_MASTER, then local[*])")
    parser.add_argument("--wal-dir", default=None, metavar="DIR",
                        help="the gateway's --wal-dir, for an s3:// warehouse on the gateway's machine: the jobs "
                             "then also see its local log (erasure waits for it) and an encrypted account's keyring "
                             "(default: the warehouse when local, ./jetlake-state on S3)")
    parser.add_argument("--log-level", default=log_level, choices=LOG_LEVELS)


def _hours(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `serve --workers N` passes them on
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
