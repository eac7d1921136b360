"""JetLake's storage engine: JetStream's streams over a write-ahead log and Delta tables.

Knows nothing of HTTP or Spark. The public surface is re-exported here.
"""

from engine.clock import Clock, ManualClock, SystemClock
from engine.errors import JetStreamError
from engine.jetstream import EngineOptions, JetStream
from engine.messages import AckRun, InboundMessage, PlainBatch, PubAck

__all__ = [
    "AckRun",
    "Clock",
    "EngineOptions",
    "InboundMessage",
    "JetStream",
    "JetStreamError",
    "ManualClock",
    "PlainBatch",
    "PubAck",
    "SystemClock",
]
