"""One router per group of JetStream's API: system, streams, publish."""
