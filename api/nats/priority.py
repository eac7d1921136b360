"""Priority groups of pull consumers: which waiting request may take messages now.

A consumer with `priority_policy` other than `none` names its `priority_groups`; every pull request
must name one of them (`group`), else `400 Bad Request - Priority Group missing` / `Invalid
Priority Group`. Then, per policy:

- `overflow`: a request with `min_pending` and/or `min_ack_pending` takes messages only while the
  consumer has at least that many pending (undelivered) or ack-pending messages (both, when both
  are given); a `no_wait` one that may not gets `404 No Messages`;
- `prioritized`: `priority` 0 (first) to 9; a request takes messages only while no waiting request
  of the consumer has a lower number (outside 0-9: `400 Bad Request - Priority must be between 0
  and 9`);
- `pinned_client`: the first request served pins the consumer to a new id, sent as `Nats-Pin-Id` on
  every message; later requests must carry it (`id`) to be served, a wrong one gets `423
  Nats-Wrong-Pin-Id`, and one without waits until the pin lapses: `priority_timeout` after the
  pinned client's last request ended, or when `$JS.API.CONSUMER.UNPIN.<stream>.<consumer>` (or the
  HTTP door's unpin route) asks the engine. The pin itself, with when it was made, is kept on the
  engine's consumer (`Consumer.pin`), so that consumer info reports it over both doors.

A new pin is announced on `$JS.EVENT.ADVISORY.CONSUMER.PINNED.<stream>.<consumer>`, a lost one on
`…UNPINNED…` with the reason `timeout` or `admin` (the unpin API); the callbacks that send them
come from above (api/nats/advisories.py), so this room knows no subjects.
Counterpart: server/consumer.go (processNextMsgRequest's priority checks, `PriorityGroup`,
`checkPending`, `setPinnedTimer`, `assignNewPinId`, `unassignPinId`) and jetstream_api.go
(jsConsumerUnpinRequest).
"""

from __future__ import annotations

import asyncio
import secrets
import string
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from api.nats import protocol as p
from engine.consumer import Consumer

NS = 1_000_000_000
_PIN_ALPHABET = string.ascii_letters + string.digits

# (stream, consumer, group, pin id) and (stream, consumer, group, reason): the advisories' senders.
Pinned = Callable[[str, str, str, str], None]
Unpinned = Callable[[str, str, str, str], None]


@dataclass(slots=True)
class PriorityRequest:
    """What a pull request says about its group."""

    group: str = ""
    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int = 0
    pin_id: str = ""


@dataclass
class _Pin:
    pin_id: str
    group: str
    active: int = 0  # requests of the pinned client now waiting
    released_at: float = field(default_factory=time.monotonic)  # when the last of them ended
    lapse: asyncio.TimerHandle | None = None  # announces the timeout once nobody of the pinned client waits


def _ignore(stream: str, consumer: str, group: str, detail: str) -> None:
    return None


class PriorityGroups:
    """Priority state of every consumer of one account, by consumer id."""

    def __init__(self, pinned: Pinned = _ignore, unpinned: Unpinned = _ignore) -> None:
        self._waiting: dict[str, Counter[int]] = {}  # prioritized: waiting requests per priority
        self._pins: dict[str, _Pin] = {}
        self._pinned = pinned
        self._unpinned = unpinned

    def refusal(self, target: Consumer, req: PriorityRequest, batch: int, max_bytes: int) -> bytes | None:
        """The status refusing the request at once (a bad group, priority or pin id), or None."""
        config = target.config
        if config.priority_policy == "none" or not config.priority_groups:
            return None
        if not req.group:
            return p.status_headers(400, "Bad Request - Priority Group missing")
        if req.group not in config.priority_groups:
            return p.status_headers(400, "Bad Request - Invalid Priority Group")
        if config.priority_policy == "prioritized" and not 0 <= req.priority <= 9:
            return p.status_headers(400, "Bad Request - Priority must be between 0 and 9")
        if config.priority_policy == "pinned_client" and req.pin_id and req.pin_id != self._current_pin(target):
            return p.pending_status(423, "Nats-Wrong-Pin-Id", batch, max_bytes)
        return None

    def may_take(self, target: Consumer, req: PriorityRequest) -> bool:
        """Whether the request may take messages now."""
        policy = target.config.priority_policy
        if policy == "overflow":
            if req.min_pending > 0 and target.num_pending_after([]) < req.min_pending:
                return False
            return not (req.min_ack_pending > 0 and len(target.state.pending) < req.min_ack_pending)
        if policy == "prioritized":
            waiting = self._waiting.get(target.consumer_id)
            return not waiting or req.priority <= min(k for k, n in waiting.items() if n > 0)
        if policy == "pinned_client":
            pin = self._current_pin(target)
            return not pin or req.pin_id == pin
        return True

    def pin_headers(self, target: Consumer, req: PriorityRequest) -> dict[str, list[str]] | None:
        """Before delivering to the request: the pin its messages carry (made now if there is none)."""
        if target.config.priority_policy != "pinned_client":
            return None
        pin = self._pins.get(target.consumer_id)
        if pin is None or not self._current_pin(target):
            pin = self._pins[target.consumer_id] = _Pin("".join(secrets.choice(_PIN_ALPHABET) for _ in range(22)), req.group)
            target.pin = (pin.pin_id, time.time_ns())  # what consumer info reports, over either door
            self._pinned(target.stream.name, target.name, pin.group, pin.pin_id)
        if req.pin_id != pin.pin_id:
            req.pin_id = pin.pin_id
            self._hold(pin)
        return {"Nats-Pin-Id": [pin.pin_id]}

    def unpin(self, target: Consumer, group: str) -> None:
        """After the engine's unpin (from either door): the pin's timer is dropped and the pin announced
        as lost by `admin` (even when there was none, as nats-server announces it); the next request
        served gets a new one."""
        target.pin = None
        pin = self._pins.pop(target.consumer_id, None)
        if pin is not None and pin.lapse is not None:
            pin.lapse.cancel()
        self._unpinned(target.stream.name, target.name, group, "admin")

    def entered(self, target: Consumer, req: PriorityRequest) -> None:
        if target.config.priority_policy == "prioritized":
            self._waiting.setdefault(target.consumer_id, Counter())[req.priority] += 1
        pin = self._pins.get(target.consumer_id)
        if pin is not None and req.pin_id == pin.pin_id:
            self._hold(pin)

    def left(self, target: Consumer, req: PriorityRequest) -> None:
        waiting = self._waiting.get(target.consumer_id)
        if waiting is not None:
            waiting[req.priority] -= 1
            if not +waiting:
                del self._waiting[target.consumer_id]
        pin = self._pins.get(target.consumer_id)
        if pin is not None and req.pin_id == pin.pin_id:
            pin.active -= 1
            if pin.active <= 0:
                pin.released_at = time.monotonic()
                # setPinnedTimer: the lapse is announced when it happens, not when somebody next asks
                if pin.lapse is not None:
                    pin.lapse.cancel()
                pin.lapse = asyncio.get_running_loop().call_later(target.config.priority_timeout / NS + 0.001, self._lapse, target)

    def _lapse(self, target: Consumer) -> None:
        if not target.deleted:
            self._current_pin(target)

    @staticmethod
    def _hold(pin: _Pin) -> None:
        pin.active += 1
        if pin.lapse is not None:
            pin.lapse.cancel()
            pin.lapse = None

    def _current_pin(self, target: Consumer) -> str:
        """The consumer's pin id, or "" once `priority_timeout` passed with no request of the pinned client
        (then the pin is dropped and its loss announced with the reason `timeout`)."""
        pin = self._pins.get(target.consumer_id)
        if pin is None:
            return ""
        if target.pin is None or target.pin[0] != pin.pin_id:  # unpinned by the engine; announced by `unpin`
            del self._pins[target.consumer_id]
            if pin.lapse is not None:
                pin.lapse.cancel()
            return ""
        if pin.active <= 0 and time.monotonic() - pin.released_at > target.config.priority_timeout / NS:
            del self._pins[target.consumer_id]
            target.pin = None
            if pin.lapse is not None:
                pin.lapse.cancel()
            self._unpinned(target.stream.name, target.name, pin.group, "timeout")
            return ""
        return pin.pin_id
