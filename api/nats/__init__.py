"""The NATS door: the NATS client protocol and the JetStream API over it (counterpart: nats-server)."""
