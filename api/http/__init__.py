"""The HTTP door: FastAPI routes over the engine, beside the NATS door (api/nats/); both check through api/auth.py."""
