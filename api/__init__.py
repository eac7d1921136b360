"""JetLake's HTTP gateway: thin FastAPI routes over the engine. Parse, call the engine, shape the answer."""
