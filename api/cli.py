"""`jetlake`: the command line. `serve` runs the gateway; later commands run the Spark jobs and SQL."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from engine import EngineOptions, JetStream
from engine.jetstream import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL
from engine.store.lease import OwnerLockedError
from engine.stream import DEFAULT_MAX_PAYLOAD

log = logging.getLogger("jetlake")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    options = EngineOptions(
        sync_always=args.sync == "always",
        flush_interval=args.flush_interval,
        flush_bytes=args.flush_bytes,
        max_payload=args.max_payload,
    )
    engine = JetStream(args.warehouse, options)
    try:
        engine.open()
        # Publishing allocates many short-lived objects; collecting less often keeps the GC off the hot path.
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
    except OwnerLockedError as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    log.info(
        "serving warehouse %s on http://%s:%d (sync %s, flush every %.2fs)",
        engine.layout.warehouse, args.host, args.port, args.sync, args.flush_interval,
    )
    try:
        uvicorn.run(
            create_app(engine, max_body=args.max_body),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            loop="uvloop",
            http="httptools",
            timeout_graceful_shutdown=5,
        )
    finally:
        engine.close()
        log.info("gateway stopped; every stream flushed")
    return 0


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetlake", description="NATS JetStream's model on Delta Lake tables")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    serve.add_argument("--warehouse", default="./warehouse", help="warehouse folder (default ./warehouse)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4280)
    serve.add_argument(
        "--sync", choices=("os", "always"), default="os",
        help="write-ahead log sync policy, as JetStream's sync_interval: 'os' lets the OS flush, 'always' fsyncs each batch",
    )
    serve.add_argument("--flush-interval", type=_positive_float, default=DEFAULT_FLUSH_INTERVAL,
                       help="seconds between commits of each stream's log to its Delta table")
    serve.add_argument("--flush-bytes", type=int, default=DEFAULT_FLUSH_BYTES,
                       help="commit a stream early once this many bytes wait in its log")
    serve.add_argument("--max-payload", type=int, default=DEFAULT_MAX_PAYLOAD, help="largest message (headers + data)")
    serve.add_argument("--max-body", type=int, default=64 * 1024 * 1024, help="largest request body; larger is 413")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(func=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
