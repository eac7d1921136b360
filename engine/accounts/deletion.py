"""Deleting an account: its keyring first, so every stored byte of it is unreadable at once, then its tree.

An account is deleted by an operator once it has left the config (a reload that drops an account
keeps its data, as nats-server keeps a removed account's store). The order is what makes the
deletion immediate for an encrypted account: the keyring (its data keys, wrapped by the master key,
the header and its KDF salt) is zeroed and removed first, after which nothing, not even the master
key, opens a value of the account, wherever a copy of the bytes survives; then everything under
`warehouse/<account>/` goes (stream tables, configs, consumers, buckets, erasures, index snapshots,
tombstones, the ack table, the object-store logs) through the warehouse's `ObjectStore`, so the same
code deletes a local folder and an S3 prefix; then the gateway's own local write-ahead logs. The
account's owner lease is held throughout: a gateway still serving the account refuses the deletion,
and no gateway opens the account while it goes. The answer is a receipt: what was destroyed, how
much, and when. A deletion cut short (a crash after the keyring went) is finished by deleting again:
it goes on while anything of the account is left. Counterpart: server/jetstream_api.go
`jsLeaderAccountPurgeRequest` (`$JS.API.ACCOUNT.PURGE.<account>`: the account's streams deleted and
its store folder removed).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from engine.clock import Clock, SystemClock
from engine.errors import ErrorCode, JetStreamError
from engine.encryption import keyring_files, legacy_keyring
from engine.store import failpoints
from engine.store.lease import OwnerLock, OwnerLockedError
from engine.store.layout import Layout
from engine.store.objectstore import WarehouseLocation
from engine.store.objectstore.base import TEMP_PREFIX

log = logging.getLogger(__name__)

KEYS_FAILPOINT = "accounts.delete_keys"  # engine/store/failpoints.py: the keyring's destruction
SYSTEM_FOLDER = "_system"
LEASES_FOLDER = "leases"


def check_account_name(account: str) -> str:
    """An account name that names one folder of the warehouse (`warehouse/<account>/`)."""
    if (not account or "/" in account or "\\" in account or "\x00" in account or account in (".", "..")
            or account.startswith(TEMP_PREFIX)):
        raise JetStreamError(400, ErrorCode.BAD_REQUEST, f"invalid account name {account!r}")
    return account


def account_in_config(account: str) -> JetStreamError:
    """The refusal of a deletion of an account the config still has."""
    return JetStreamError(
        409, ErrorCode.NONE,
        f"account {account} is in the config: remove it from the config (and reload the gateway) before deleting it")


def delete_account(warehouse: str | Path | WarehouseLocation, account: str, wal_dir: str | Path | None = None,
                   clock: Clock | None = None) -> dict[str, Any]:
    """Deletes every stored byte of an account: the keyring first, then its tree and its local logs.

    The caller has checked that the account is no longer in the config and closed its engine.

    Returns:
        The receipt: the account, when the request began, when the keyring was destroyed (with how
        many files and bytes), how many objects and bytes of the warehouse and files of the local logs
        were removed, the streams that were deleted, and when it was done.

    Raises:
        JetStreamError: 404 when the warehouse holds nothing of the account; 409 when a gateway owns it.
    """
    clock = clock or SystemClock()
    layout = Layout(warehouse, check_account_name(account), wal_dir)
    requested = clock.now_ns()
    objects = layout.objects
    keyrings = [files for files in (keyring_files(layout), legacy_keyring(layout)) if files is not None]
    keyring_key = layout.key(SYSTEM_FOLDER, "keys") + "/"  # the keyring is counted apart
    found = [meta for meta in objects.list(account) if not meta.key.startswith(keyring_key)]
    logs = _local_logs(layout)
    if not found and not any(files.names() for files in keyrings) and logs is None:
        raise JetStreamError(404, ErrorCode.NONE,
                             f"account {account} has no data in the warehouse {layout.location.uri()}")
    owner = OwnerLock(layout)
    try:
        owner.acquire()
    except OwnerLockedError as exc:
        raise JetStreamError(409, ErrorCode.NONE, f"account {account} cannot be deleted now: {exc}") from None
    try:
        fault = failpoints.hit(KEYS_FAILPOINT) if failpoints.ARMED else None
        destroyed = [files.destroy() for files in keyrings]
        keys_destroyed = clock.now_ns()
        failpoints.after(KEYS_FAILPOINT, fault)
        streams = _stream_names(layout, [meta.key for meta in found])
        _delete_all_but_owner_lease(layout)
    finally:
        owner.release()
    objects.delete_prefix(account)
    log_files = _remove_local_logs(logs)
    receipt = {
        "account": account,
        "requested": requested,
        "keyring_destroyed": keys_destroyed if sum(d.files for d in destroyed) else None,
        "keyring_files": sum(d.files for d in destroyed),
        "keyring_bytes": sum(d.bytes for d in destroyed),
        "streams": streams,
        "objects_deleted": len(found),
        "bytes_deleted": sum(meta.size for meta in found),
        "log_files_deleted": log_files,
        "completed": clock.now_ns(),
    }
    log.info("account %s deleted: keyring %s (%d files), %d streams, %d objects (%d bytes) of the warehouse, "
             "%d local log files", account, "destroyed" if receipt["keyring_files"] else "absent (plain account)",
             receipt["keyring_files"], len(streams), len(found), receipt["bytes_deleted"], log_files)
    return receipt


def _stream_names(layout: Layout, keys: list[str]) -> list[str]:
    """The streams the account had, by their config records' file names (a name too long for a file
    shows as its readable prefix and hash, engine/store/layout.py's `file_name`)."""
    prefix = layout.stream_configs_key + "/"
    return sorted(key[len(prefix):].removesuffix(".json") for key in keys
                  if key.startswith(prefix) and "/" not in key[len(prefix):])


def _delete_all_but_owner_lease(layout: Layout) -> None:
    """Every folder of the account's tree but its leases, then every lease but the owner's, which is
    held until the end (its own key goes with the final `delete_prefix`)."""
    objects = layout.objects
    account = layout.account
    folders: set[str] = set()
    leases: list[str] = []
    for meta in objects.list(account):
        parts = meta.key.split("/")
        if len(parts) < 3:
            objects.delete(meta.key)
        elif parts[1] != SYSTEM_FOLDER:
            folders.add("/".join(parts[:2]))
        elif parts[2] == LEASES_FOLDER:
            leases.append(meta.key)
        elif len(parts) == 3:
            objects.delete(meta.key)
        else:
            folders.add("/".join(parts[:3]))
    for folder in sorted(folders):
        objects.delete_prefix(folder)
    for key in leases:
        if key != layout.owner_key:
            objects.delete(key)


def _local_logs(layout: Layout) -> Path | None:
    """The account's folder of local write-ahead logs when it lies outside the warehouse's store (an
    s3:// warehouse, or `--wal-dir`): the gateway's own disk, removed as a folder. None when absent."""
    folder = layout.wal_dir_root
    root = layout.location.root
    if root is not None and folder.resolve() == (root / layout.account).resolve():
        return None  # in the warehouse: the object store's delete covers it
    return folder if folder.is_dir() else None


def _remove_local_logs(folder: Path | None) -> int:
    if folder is None:
        return 0
    files = sum(len(names) for _, _, names in os.walk(folder))
    shutil.rmtree(folder)
    return files
