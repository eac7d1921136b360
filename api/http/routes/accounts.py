"""The system account's routes: the accounts, their usage, GDPR erasure and key rotation in any of them,
and the deletion of an account that left the config.

Only a user of the configured `system_account` reaches these (or anyone on a gateway without a
config); the account acted on is the one in the path (api/http/gate.py). Counterpart: the account
requests nats-server answers on `$SYS.REQ.SERVER.PING.ACCOUNTZ` and `$SYS.REQ.ACCOUNT.<acc>.JSZ`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.http import deps
from api.http.body import json_object
from api.http.responses import json_response
from api.http.routes.erasures import erase, parse_request
from engine.accounts.registry import Account
from engine.erasures import registry
from engine.jetstream import API_LEVEL

router = APIRouter(prefix="/v1/accounts")


def _summary(account: Account) -> dict[str, Any]:
    out: dict[str, Any] = {"name": account.name, "jetstream": account.config.jetstream is not None and account.engine is not None}
    if out["jetstream"]:
        out["info"] = account.jetstream().account_info()
        out["info"]["api"] = {"level": API_LEVEL, "total": account.api.total, "errors": account.api.errors}
    return out


@router.get("")
def list_accounts(request: Request) -> Response:
    accounts = deps.gate(request).accounts
    found = [accounts.get(name) for name in accounts.names()]
    listed = [_summary(a) for a in found if a is not None]
    return json_response({"total": len(listed), "accounts": listed})


@router.get("/{account}")
def account_info(request: Request, account: str) -> Response:
    return json_response(_summary(deps.account(request)))


@router.post("/{account}/erasures")
async def request_erasure(request: Request, account: str) -> Response:
    stream, seq, filter_ = parse_request(await json_object(request))
    return json_response(await erase(deps.engine(request), stream, seq, filter_), 202)


@router.get("/{account}/erasures/{erasure_id}")
def erasure_status(request: Request, account: str, erasure_id: str) -> Response:
    return json_response(registry(deps.engine(request).layout).get(erasure_id))


@router.post("/{account}/streams/{stream}/rotate-key")
def rotate_key(request: Request, account: str, stream: str) -> Response:
    """A new key epoch for an encrypted stream's new writes, at once (docs/encryption.md); the
    compaction job with the keyring re-encrypts the older values and then destroys the older keys."""
    return json_response({"stream": stream, "epoch": deps.engine(request).rotate_key(stream)})


@router.delete("/{account}")
async def delete_account(request: Request, account: str) -> Response:
    """Deletes an account the config no longer has (docs/encryption.md): its keyring first, so every
    stored byte is unreadable at once, then its tables, configs and logs; answers the receipt."""
    accounts = deps.gate(request).accounts
    receipt = await run_in_threadpool(accounts.delete, account)
    return json_response({"initiated": True, "receipt": receipt})
