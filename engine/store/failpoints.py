"""Named failpoints: faults a test can inject at each durable step of the engine, in a real process.

Every step that makes something durable (a log append, a segment seal or unlink, a table commit, a
checkpoint, an fsync of committed files, the deletion of folded ack rows) calls `hit(name)` first.
Disarmed, that is one truth test of the module-level dict `ARMED` (empty), so the hot path pays
nothing. Armed, the step fails the way a disk or a process fails, which is how the fault-injection
suite (tests/faults/) proves that nothing acknowledged is lost or doubled. Counterpart: none in
nats-server (its tests inject faults by hand); FreeBSD's and TiKV's `fail` points are the model.

Arming: the environment variable `JETLAKE_FAILPOINTS`, read when the module is imported (so a
gateway subprocess is armed by its environment), or `arm()` in-process::

    JETLAKE_FAILPOINTS="wal.append=enospc@3,stream.commit=raise_after"

    spec     := point ("," point)*
    point    := name "=" action ["@" nth ["+"]]
    action   := "enospc" | "eio"       raise OSError(ENOSPC / EIO) before the step does anything
              | "kill"                 SIGKILL this process before the step
              | "raise_after"          let the step take effect, then raise OSError(EIO): a commit lands
                                       and then fails, as delta-rs does when its post-commit checkpoint fails
              | "kill_after"           let the step take effect, then SIGKILL this process
              | "corrupt"              let the step take effect, then flip a byte of what it wrote (log appends)
              | "short"                write part of the bytes, then raise OSError(ENOSPC) (log appends)
    nth      := the 1-based hit of `name` that fires (default: every hit); "N+" fires on the Nth and every later one

Names (a step that does not support an action treats it as its nearest kind, e.g. `corrupt` as `raise_after`):
    wal.append, wal.rotate, wal.unlink             a stream's write-ahead log: append, seal, unlink flushed segments
    acklog.append, acklog.rotate, acklog.unlink    the account's ack log, likewise
    stream.commit, stream.checkpoint, stream.sync  a stream table's Parquet write and commit, its checkpoint,
                                                   the fsync of the committed files (`--sync always`)
    tombstones.commit, tombstones.checkpoint, tombstones.sync
    acks.commit, acks.checkpoint, acks.sync, acks.fold   the ack table; `fold` deletes rows folded by snapshots
    retention.delete, retention.deleted            the maintenance jobs' steps (jobs/tables.py `reached`):
    compact.optimize, compact.optimized            before and after a rewrite; the erase job's also between
    erase.delete, erase.deleted, erase.retention_zeroed, erase.vacuumed, erase.log_cleaned,
    erase.retention_restored, erase.cleaned, erase.tombstones_removed      its property changes and cleanups
    keys.rotate                                    a stream's new key epoch (engine/keys/stream_keys.py `rotate`)
    stream.config                                  a stream's config record put (create, update; engine/catalog_store.py)
    accounts.delete_keys                           an account deletion's keyring step (engine/accounts/deletion.py)
    rekey.merge, rekey.merged                      compaction's re-encryption of a stream (jobs/rekey.py): before
                                                   and after its MERGE, before the older keys are destroyed
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "JETLAKE_FAILPOINTS"
BEFORE = frozenset({"enospc", "eio", "kill"})
AFTER = frozenset({"raise_after", "kill_after", "corrupt", "short"})
ACTIONS = BEFORE | AFTER


@dataclass
class Failpoint:
    name: str
    action: str
    nth: int = 0  # 0: every hit
    onward: bool = False
    hits: int = 0

    def fires(self) -> bool:
        self.hits += 1
        if not self.nth:
            return True
        return self.hits >= self.nth if self.onward else self.hits == self.nth


ARMED: dict[str, Failpoint] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, Failpoint]:
    """The failpoints of a spec string (grammar in the module docstring); ValueError when malformed."""
    points: dict[str, Failpoint] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, rest = part.partition("=")
        action, _, nth = rest.partition("@")
        if not sep or not name or action not in ACTIONS:
            raise ValueError(f"bad failpoint {part!r}: want name=action[@N[+]] with action one of {sorted(ACTIONS)}")
        onward = nth.endswith("+")
        digits = nth.rstrip("+")
        if nth and (not digits.isdigit() or int(digits) < 1):
            raise ValueError(f"bad failpoint {part!r}: @N wants a positive hit number")
        points[name.strip()] = Failpoint(name.strip(), action, int(digits or 0), onward)
    return points


def arm(spec: str) -> None:
    """Arms the failpoints of `spec` (replacing any armed before)."""
    points = parse(spec)
    with _lock:
        ARMED.clear()
        ARMED.update(points)
    if points:
        log.warning("failpoints armed: %s", spec)


def disarm() -> None:
    with _lock:
        ARMED.clear()


def hit(name: str) -> str | None:
    """A step named `name` is about to run. Raises or kills for a firing "before" action; returns a
    firing "after" action for the step to carry out (see `after`); None when nothing fires."""
    point = ARMED.get(name)
    if point is None:
        return None
    with _lock:
        fires = point.fires()
    if not fires:
        return None
    log.warning("failpoint %s fires: %s (hit %d)", name, point.action, point.hits)
    if point.action == "kill":
        _kill()
    if point.action in ("enospc", "eio"):
        raise _error(point.action, name)
    return point.action


def after(name: str, action: str | None) -> None:
    """Carries out an "after" action once the step has taken effect (`corrupt` and `short` are done by
    the steps that support them; elsewhere they act as `raise_after`)."""
    if action is None:
        return
    if action == "kill_after":
        _kill()
    raise _error("enospc" if action == "short" else "eio", name)


def _error(kind: str, name: str) -> OSError:
    code = errno.ENOSPC if kind == "enospc" else errno.EIO
    return OSError(code, f"{os.strerror(code)} (failpoint {name})")


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get(ENV):
    arm(os.environ[ENV])
