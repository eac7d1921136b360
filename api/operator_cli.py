"""`jetlake accounts delete` and `jetlake keys rotate`: the system account's operations from a shell.

- `accounts delete NAME --config FILE` works on a stopped gateway's warehouse: it refuses an account
  the config still has, then destroys the account's keyring and removes its data
  (engine/accounts/deletion.py) and prints the receipt. A gateway still serving the account holds its
  owner lease, and the command is refused (exit 2): on a running gateway the system account's
  `DELETE /v1/accounts/{account}` (or `$JS.API.ACCOUNT.PURGE.<account>`) does the same.
- `keys rotate --account A --stream S` asks a running gateway over HTTP
  (`POST /v1/accounts/{account}/streams/{stream}/rotate-key`, a user of the system account): the
  rotation changes the stream's current key epoch, which only the gateway that owns the stream may do.
Both print the answer as JSON on stdout; an error goes to stderr with exit status 1 (the request was
refused) or 2 (bad arguments, an unreachable gateway, or a warehouse held by a gateway).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from engine.accounts.config import ConfigError, ServerConfig
from engine.accounts.config import load as load_config
from engine.accounts.deletion import account_in_config, delete_account
from engine.errors import JetStreamError
from engine.store.objectstore import ObjectStoreError, WarehouseLocation

DEFAULT_GATEWAY = "http://127.0.0.1:4280"


def add_commands(commands: Any) -> None:
    """Adds `accounts` and `keys` to the `jetlake` parser's subcommands."""
    accounts = commands.add_parser("accounts", help="operator commands on accounts")
    accounts_commands = accounts.add_subparsers(dest="accounts_command", required=True)
    delete = accounts_commands.add_parser(
        "delete", help="delete an account that left the config: its keyring first, then all its data (gateway stopped)")
    delete.add_argument("name", help="the account to delete")
    delete.add_argument("--config", default=None, metavar="FILE",
                        help="the gateway's config file: the account must no longer be in it")
    delete.add_argument("--warehouse", default=None,
                        help="the warehouse (default: the config's jetstream { store_dir }, then ./warehouse)")
    delete.add_argument("--wal-dir", default=None, metavar="DIR", help="the gateway's --wal-dir, if it has one")
    delete.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    delete.set_defaults(func=_accounts_delete)

    keys = commands.add_parser("keys", help="operator commands on encryption keys")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    rotate = keys_commands.add_parser("rotate",
                                      help="start a new key epoch for a stream's new writes (running gateway)")
    rotate.add_argument("--account", required=True, help="the stream's account")
    rotate.add_argument("--stream", required=True, help="the encrypted stream")
    rotate.add_argument("--gateway", default=DEFAULT_GATEWAY, help=f"the gateway's URL (default {DEFAULT_GATEWAY})")
    rotate.add_argument("--user", default=os.environ.get("JETLAKE_USER"),
                        help="a user of the system account (default $JETLAKE_USER); password from $JETLAKE_PASSWORD")
    rotate.add_argument("--token", default=None, help="a bearer token instead (default $JETLAKE_TOKEN)")
    rotate.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    rotate.set_defaults(func=_keys_rotate)


def _accounts_delete(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config) if args.config else ServerConfig.open()
        if args.name in config.accounts:
            raise account_in_config(args.name)
        warehouse = WarehouseLocation.parse(args.warehouse or config.jetstream.store_dir or "./warehouse")
    except (ConfigError, ValueError) as exc:
        print(f"jetlake: {exc}", file=sys.stderr)
        return 2
    except JetStreamError as exc:
        print(f"jetlake: {exc.description}", file=sys.stderr)
        return 2
    try:
        receipt = delete_account(warehouse, args.name, args.wal_dir)
    except JetStreamError as exc:
        print(f"jetlake: {exc.description}", file=sys.stderr)
        return 2 if exc.code == 409 else 1
    except ObjectStoreError as exc:
        print(f"jetlake: the warehouse failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(receipt, indent=1))
    return 0


def _keys_rotate(args: argparse.Namespace) -> int:
    path = (f"/v1/accounts/{urllib.parse.quote(args.account, safe='')}/streams/"
            f"{urllib.parse.quote(args.stream, safe='')}/rotate-key")
    headers = {"Content-Type": "application/json"}
    token = args.token or os.environ.get("JETLAKE_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif args.user:
        basic = base64.b64encode(f"{args.user}:{os.environ.get('JETLAKE_PASSWORD', '')}".encode()).decode()
        headers["Authorization"] = f"Basic {basic}"
    request = urllib.request.Request(args.gateway.rstrip("/") + path, data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"jetlake: {args.gateway} refused the rotation ({exc.code}): {_description(exc.read())}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"jetlake: no gateway at {args.gateway}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 2
    print(json.dumps(answer))
    return 0


def _description(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["description"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:300]
