"""The HTTP API (FastAPI): `create_app(settings)`."""
